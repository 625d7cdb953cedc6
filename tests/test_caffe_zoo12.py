"""A twelfth sweep of public prototxt files (tests/data/zoo12/README.md lists them): the
BN-Inception deploy net and solver of Temporal Segment Networks (Wang et al., ECCV 2016;
the CUHK fork's ``BN`` layer and solver fields), BVLC's LeNet multistep solver, BVLC's
CIFAR-10 "full" net in its 2014 V1 form with the two solvers that continue its training
(``_lr1``, ``_lr2``: HDF5 snapshots), BVLC's R-CNN ILSVRC13 deploy net (with pycaffe's
Detector), and BVLC's HDF5 logistic-regression example (train_val net and solver).

As in tests/test_caffe_zoo11.py: each net is built in the phase its file is for; every
blob's and param's shape is checked against Caffe's rules (``caffe_shapes`` in
tests/zoo3_nets.py) and the shapes that tell the rules apart against numbers worked by hand
in the docstrings; forwards are checked against NumPy or torch (CPU) on seeded inputs;
solver schedules and first updates against Caffe's formulas (src/caffe/solvers/
sgd_solver.cpp: ClipGradients on the accumulated diffs, then Normalize by iter_size,
Regularize, ComputeUpdateValue).  Where a file needs what BVLC Caffe lacks, minicaffe must
refuse it where Caffe's parser or layer factory does, naming the file, the line, the layer
and the type.
"""
import os

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import minicaffe as caffe
from minicaffe.layer import UnknownLayerTypeError
from minicaffe.proto import (PrototxtError, caffe_pb2, parse_text, read_net_param, upgrade_net,
                             write_text)

from test_caffe_zoo7 import max_pool
from test_caffe_zoo10 import read
from test_caffe_zoo11 import ave_pool, check_shapes, conv_layer, randomize, relu
from zoo3_nets import caffe_shapes

ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zoo12")


def zoo(*parts):
    return os.path.join(ZOO, *parts)


TSN = zoo("tsn", "tsn_bn_inception_rgb_deploy.prototxt")
TSN_SOLVER = zoo("tsn", "tsn_bn_inception_rgb_solver.prototxt")
MULTISTEP = zoo("mnist", "lenet_multistep_solver.prototxt")
CIFAR_FULL = zoo("cifar10", "cifar10_full_train_test_v1.prototxt")
CIFAR_LR1 = zoo("cifar10", "cifar10_full_solver_lr1.prototxt")
CIFAR_LR2 = zoo("cifar10", "cifar10_full_solver_lr2.prototxt")
RCNN = zoo("rcnn", "deploy.prototxt")
LOGREG = zoo("hdf5_classification", "train_val.prototxt")
LOGREG_SOLVER = zoo("hdf5_classification", "solver.prototxt")

# TSN's BN layers: the fork's ``bn_param`` block closes each layer on its own line
BN_PARAM = ('  bn_param { frozen: true slope_filler { type: "constant" value: 1 } '
            'bias_filler { type: "constant" value: 0 } } }\n')


def test_files_are_the_stored_copies():
    """Each file has the stored copy's length (``total_chars``); the TSN deploy net (written
    by a short script from its regular blocks) has the stored text on either side of
    read_file's 16,000-character boundaries, and its head and tail."""
    lengths = {TSN: 59656, TSN_SOLVER: 520, MULTISTEP: 871, CIFAR_FULL: 2969, CIFAR_LR1: 944,
               CIFAR_LR2: 945, RCNN: 2832, LOGREG: 999, LOGREG_SOLVER: 386}
    assert {p: len(read(p)) for p in lengths} == lengths
    tsn = read(TSN)
    # the stored pieces' last and first characters at each boundary, as read
    for offset, before, after in (
            (16000, 't" value: 1 } bias_filler { type: "const', 'ant" value: 0 } } }\nlayer { name: "incep'),
            (32000, 'uce_bn" type: "BN" bottom: "inception_4c', '/3x3_reduce" top: "inception_4c/3x3_reduce_bn"'),
            (48000, 'ion_5a/3x3_reduce"\n  param { lr_mult: 1 ', 'decay_mult: 1 } param { lr_mult: 2 decay_')):
        assert tsn.endswith(before, 0, offset) and tsn.startswith(after, offset), offset
    assert tsn.startswith('name: "BN-Inception"\n\n' + "#" * 39 + " data " + "#" * 39
                          + '\ninput: "data"\ninput_dim: 1\ninput_dim: 3\ninput_dim: 224\n')
    assert tsn.endswith('  inner_product_param { num_output: 101\n'
                        '    weight_filler { type: "gaussian" std: 0.001 }\n'
                        '    bias_filler { type: "constant" value: 0 } } }\n')
    assert tsn.count(BN_PARAM) == 69 and tsn.count('type: "Convolution"') == 69
    # the file's spacing varies by branch: tight for conv2's two, each block's 1x1 and 3x3_reduce
    # and both double_3x3s, 8 * 4 + 2 * 3 + 2 = 40; spaced for the other 29
    assert tsn.count('weight_filler { type: "xavier"}') == 40
    assert tsn.count('weight_filler { type: "xavier" }') == 29
    assert 'convolution_param { num_output: 160 pad: 1 kernel_size: 3 stride: 2\n' in tsn
    solver = read(TSN_SOLVER)
    assert "test_iter:950\n" in solver and solver.endswith("device_id: [0,1,2,3]\nrichness: 200\n\n")
    assert read(CIFAR_LR2) == read(CIFAR_LR1).replace("base_lr: 0.0001\n", "base_lr: 0.00001\n") \
        .replace("max_iter: 65000\n", "max_iter: 70000\n")
    assert read(RCNN).count("_filler") == 0                   # a deploy net without fillers


# ------------------------------------------------------------------------------ helpers
def torch_forward(param, net, x):
    """A reference forward of ``param`` in float64 through torch, from ``net``'s weights:
    Caffe's Convolution, BatchNorm (TEST: the stored sums divided by the scale factor, eps
    inside the square root), Scale, ReLU, Pooling (ceil, MAX or AVE counting the padding, as
    Caffe does where no window overhangs the padded input), Concat, Dropout (identity),
    InnerProduct.  Returns every blob."""
    blobs = {"data": torch.from_numpy(x.astype(np.float64))}
    for lp in param.layer:
        if lp.type == "Input":
            continue
        bottom = [blobs[b] for b in lp.bottom]
        ps = ([torch.from_numpy(p.data.astype(np.float64)) for p in net.params[lp.name]]
              if lp.name in net.params else [])
        if lp.type == "Convolution":
            cp = lp.convolution_param
            y = F.conv2d(bottom[0], ps[0], ps[1] if cp.bias_term else None,
                         stride=cp.stride[0] if cp.stride else 1, padding=cp.pad[0] if cp.pad else 0)
        elif lp.type == "BatchNorm":
            factor = 0 if ps[2][0] == 0 else 1 / ps[2][0]
            mean, var = ps[0] * factor, ps[1] * factor
            eps = lp.batch_norm_param.eps
            y = (bottom[0] - mean[:, None, None]) / torch.sqrt(var + eps)[:, None, None]
        elif lp.type == "Scale":
            y = bottom[0] * ps[0][:, None, None] + ps[1][:, None, None]
        elif lp.type == "ReLU":
            y = torch.relu(bottom[0])
        elif lp.type == "Pooling":
            pp = lp.pooling_param
            if pp.pool == caffe_pb2.PoolingParameter.MAX:
                y = F.max_pool2d(bottom[0], pp.kernel_size, pp.stride, pp.pad, ceil_mode=True)
            else:
                y = F.avg_pool2d(bottom[0], pp.kernel_size, pp.stride, pp.pad, ceil_mode=True,
                                 count_include_pad=True)
        elif lp.type == "Concat":
            y = torch.cat(bottom, 1)
        elif lp.type == "Dropout":
            y = bottom[0]
        elif lp.type == "InnerProduct":
            y = F.linear(bottom[0].flatten(1), ps[0], ps[1])
        else:
            raise AssertionError(f"no reference for {lp.type}")
        for top in lp.top:
            blobs[top] = y
    return {k: v.numpy() for k, v in blobs.items()}


def write_stand_in(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def float32_mean(values):
    """Solver::Test's mean: a float sum over test_iter batches, then one division."""
    total = np.float32(0)
    for v in values:
        total = np.float32(total + np.float32(v))
    return np.float32(total / np.float32(len(values)))


# ------------------------------------------------------------ TSN: BN-Inception (UCF101)
def test_tsn_bn_inception_is_refused_where_caffe_stops(tmp_path):
    """TSN's deploy net (the CUHK Caffe fork's BN-Inception) normalizes with the fork's
    ``BN`` layer.  caffe.proto's LayerParameter has no ``bn_param``, so protobuf's text
    parser stops at the first one, line 19 column 3, inside layer 'conv1/7x7_s2_bn' (line
    17).  With every ``bn_param`` taken out (its line kept, the layer's closing brace
    left), the file parses and Caffe's layer factory stops at the first ``BN`` layer in
    layer order, the same 'conv1/7x7_s2_bn' at line 17: "Unknown layer type: BN"."""
    text = read(TSN)
    assert text.splitlines()[16].startswith('layer { name: "conv1/7x7_s2_bn" type: "BN"')
    with pytest.raises(PrototxtError) as e:
        caffe.Net(TSN, caffe.TEST)
    msg = str(e.value)
    assert msg.startswith(f"{TSN}:19:3: ") and 'has no field named "bn_param"' in msg
    assert "layer 'conv1/7x7_s2_bn' (line 17) has type \"BN\"" in msg
    path = tmp_path / "tsn_no_bn_param.prototxt"
    stripped = text.replace(BN_PARAM, "  }\n")
    assert stripped.count("\n") == text.count("\n")
    path.write_text(stripped)
    parse_text(stripped, caffe_pb2.NetParameter)
    with pytest.raises(UnknownLayerTypeError) as e:
        caffe.Net(str(path), caffe.TEST)
    assert str(e.value).startswith(f"{path}:17: layer 'conv1/7x7_s2_bn': unknown layer type 'BN'")


def tsn_bvlc(keep_bn_params=False):
    """The deploy net in BVLC's layers: each frozen ``BN`` (TSN's ``frozen: true`` uses its
    stored statistics) a BatchNorm with ``use_global_stats`` and an in-place Scale with a
    bias (BVLC's BatchNorm has no affine part), same bottom and top."""
    param = parse_text(read(TSN).replace(BN_PARAM, "  }\n"), caffe_pb2.NetParameter)
    layers = []
    for lp in param.layer:
        if lp.type != "BN":
            layers.append(lp)
            continue
        bn = caffe_pb2.LayerParameter(name=lp.name, type="BatchNorm", bottom=list(lp.bottom),
                                      top=list(lp.top))
        bn.batch_norm_param.use_global_stats = True
        if keep_bn_params:
            bn.param.extend(lp.param)
        scale = caffe_pb2.LayerParameter(name=lp.name + "/scale", type="Scale",
                                         bottom=list(lp.top), top=list(lp.top))
        scale.scale_param.bias_term = True
        layers += [bn, scale]
    del param.layer[:]
    param.layer.extend(layers)
    return param


def test_tsn_bn_inception_in_bvlc_layers(tmp_path):
    """BN-Inception (Ioffe and Szegedy 2015) at 224: conv1 7x7/2 pad 3 gives 112, pool1
    ceil((112 - 3) / 2) + 1 = 56, conv2 56, pool2 ceil(53 / 2) + 1 = 28; 3a: 64 + 64 + 96 +
    32 = 256 channels, 3b 64 + 96 + 96 + 64 = 320; 3c halves the map with its two stride-2
    3x3s ((28 + 2 - 3) // 2 + 1 = 14) and a 3x3/2 MAX pool (ceil(25 / 2) + 1 = 14) and passes
    the 320 channels on: 160 + 96 + 320 = 576; 4a..4d 576, 576, 608, 608; 4e 192 + 256 + 608
    = 1056 at 7; 5a, 5b 1024 at 7 (5b's pool branch is MAX 3x3/1 pad 1); the 7x7 AVE
    global_pool gives 1, and fc-action reads 1024 for UCF101's 101 classes.  The 69
    BatchNorms keep (C,), (C,) and the (1,) scale factor; the BN layers' own params (lr_mult
    1) cannot move onto BatchNorm, whose LayerSetUp CHECKs lr_mult 0 ("Cannot configure
    batch normalization statistics as layer parameters").  The forward at 224, with seeded
    weights and statistics (scale factor 2: Caffe divides the sums by it), equals torch's in
    float64 at every blob; the weights round-trip through a .caffemodel."""
    with pytest.raises(ValueError, match=r"layer 'conv1/7x7_s2_bn'.*lr_mult 1.*cannot be "
                                         r"configured as layer parameters"):
        caffe.Net(tsn_bvlc(keep_bn_params=True), caffe.TEST)

    param = tsn_bvlc()
    path = tmp_path / "tsn_bvlc.prototxt"
    write_text(param, str(path))
    net = caffe.Net(str(path), caffe.TEST)
    blobs, params = check_shapes(net, str(path), caffe.TEST)
    walk = [blobs[n] for n in ("conv1/7x7_s2", "pool1/3x3_s2", "pool2/3x3_s2")]
    assert walk == [(1, 64, 112, 112), (1, 64, 56, 56), (1, 192, 28, 28)]
    channels = {b: blobs[f"inception_{b}/output"][1:] for b in
                ("3a", "3b", "3c", "4a", "4b", "4c", "4d", "4e", "5a", "5b")}
    assert channels == {"3a": (256, 28, 28), "3b": (320, 28, 28), "3c": (576, 14, 14),
                        "4a": (576, 14, 14), "4b": (576, 14, 14), "4c": (608, 14, 14),
                        "4d": (608, 14, 14), "4e": (1056, 7, 7), "5a": (1024, 7, 7),
                        "5b": (1024, 7, 7)}
    assert blobs["global_pool"] == (1, 1024, 1, 1) and blobs["fc-action"] == (1, 101)
    assert params["conv1/7x7_s2"] == [(64, 3, 7, 7), (64,)]
    assert params["conv1/7x7_s2_bn"] == [(64,), (64,), (1,)]
    assert params["conv1/7x7_s2_bn/scale"] == [(64,), (64,)]
    assert params["inception_3c/3x3"] == [(160, 128, 3, 3), (160,)]
    assert params["fc-action"] == [(101, 1024), (101,)]
    assert sum(lp.type == "BatchNorm" for lp in param.layer) == 69
    specs = dict(zip(net.layer_names, net.param_specs))
    assert [s.lr_mult for s in specs["conv1/7x7_s2_bn"]] == [0, 0, 0]

    randomize(net, seed=81)
    rng = np.random.default_rng(82)
    for name, layer in zip(net.layer_names, net.layers):
        if layer.type == "BatchNorm":
            c = layer.blobs[0].shape[0]
            layer.blobs[0].data[...] = 2 * 0.1 * rng.standard_normal(c)     # sums, factor 2
            layer.blobs[1].data[...] = 2 * rng.uniform(0.5, 2, c)
            layer.blobs[2].data[...] = 2
        elif layer.type == "Scale":
            layer.blobs[0].data[...] = rng.uniform(0.5, 1.5, layer.blobs[0].shape)
            layer.blobs[1].data[...] = 0.1 * rng.standard_normal(layer.blobs[1].shape)
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    out = net.forward(data=x)["fc-action"].copy()
    ref = torch_forward(param, net, x)
    for name in blobs:
        got, want = net.blobs[name].data, ref[name]
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * np.abs(want).max(), err_msg=name)
    # conv1's BatchNorm (sums / 2, eps 1e-5 inside the root), Scale and in-place ReLU by hand
    bn = dict(zip(net.layer_names, net.layers))["conv1/7x7_s2_bn"]
    mean, var = (b.data.astype(np.float64) / 2 for b in bn.blobs[:2])
    conv1 = ref["conv1/7x7_s2"][0]
    gamma, beta = (p.data.astype(np.float64) for p in net.params["conv1/7x7_s2_bn/scale"])
    by_hand = relu((conv1 - mean[:, None, None]) / np.sqrt(var + 1e-5)[:, None, None]
                   * gamma[:, None, None] + beta[:, None, None])
    np.testing.assert_allclose(net.blobs["conv1/7x7_s2_bn"].data[0], by_hand, rtol=1e-4, atol=1e-4)

    model = str(tmp_path / "tsn.caffemodel")
    net.save(model)
    fresh = caffe.Net(str(path), caffe.TEST, weights=model)
    np.testing.assert_array_equal(fresh.params["conv1/7x7_s2_bn"][2].data, [2])
    np.testing.assert_array_equal(fresh.forward(data=x)["fc-action"], out)


TSN_STAND_IN = """name: "tsn-stand-in"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 8 } shape { dim: 4 }
    data_filler { type: "constant" value: 50 } data_filler { type: "constant" value: 3 } } }
layer { name: "fc-action" type: "InnerProduct" bottom: "data" top: "fc-action"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  inner_product_param { num_output: 101 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc-action" bottom: "label" top: "loss" }
layer { name: "accuracy" type: "Accuracy" bottom: "fc-action" bottom: "label" top: "accuracy"
  include { phase: TEST } }
"""


def test_tsn_solver(tmp_path, monkeypatch):
    """TSN's solver: ``test_iter:950`` (no space after the colon) parses; ``device_id:
    [0,1,2,3]`` does not: device_id is a single int32 in caffe.proto, and protobuf's parser
    takes ``[...]`` only for a repeated field (line 30, column 12, at the ``[``; BVLC Caffe
    takes GPUs on the command line, ``caffe train -gpu 0,1,2,3``); then ``richness`` (line
    31) is the fork's own field.  Without them, on a stand-in of the train_val net (its
    VideoData layers are the fork's): SGD, ``step`` (0.001, x0.1 every 2000), iter_size 2,
    clip_gradients 40, average_loss 20, and a test at iteration 0 (test_initialization)
    of 950 batches, whose loss is the float mean Solver::Test computes (950 float sums of
    ln 101, then one division: not ln 101 in float).

    The first update by hand: the stand-in's weights start at 0, so every class has p =
    1/101 and each of the two passes gives dW = (p - e_3) x^T with x = 50 everywhere, db = p -
    e_3.  Caffe clips the *accumulated* diffs (norm |2 dW, 2 db| = 2 sqrt(1 - 1/101)
    sqrt(8 * 2500 + 1) = 281.4 > 40, scaled by 40 / 281.4) before Normalize divides by
    iter_size, so W = -0.001 * (40 / 281.4) * dW and b = -0.002 * (40 / 281.4) * db."""
    monkeypatch.chdir(tmp_path)
    text = read(TSN_SOLVER)
    for line, column, what, fix in ((30, 12, "device_id: [0,1,2,3]", "device_id: [0,1,2,3]\n"),
                                    (31, 1, '"richness"', "richness: 200\n")):
        with open("solver.prototxt", "w") as f:
            f.write(text)
        with pytest.raises(PrototxtError) as e:
            caffe.get_solver("solver.prototxt")
        msg = str(e.value)
        assert msg.startswith(f"solver.prototxt:{line}:{column}: ") and what in msg, msg
        text = text.replace(fix, "\n")
    with open("solver.prototxt", "w") as f:
        f.write(text)
    write_stand_in("models/ucf101/tsn_bn_inception_rgb_train_val.prototxt", TSN_STAND_IN)
    solver = caffe.get_solver("solver.prototxt")
    p = solver.param
    assert type(solver) is caffe.SGDSolver and len(solver.test_nets) == 1
    assert (p.iter_size, p.average_loss, p.test_iter[0], p.test_interval, p.display) == (2, 20, 950, 500, 20)
    assert (p.clip_gradients, p.stepsize, p.max_iter, p.snapshot) == (40, 2000, 4500, 0)
    assert p.test_initialization and p.snapshot_prefix == "models/ucf101_split1_tsn_rgb_bn_inception"
    rates = []
    for it in (0, 1999, 2000, 3999, 4000, 4499):
        solver.iter = it
        rates.append(solver.get_learning_rate())
    np.testing.assert_allclose(rates, [1e-3, 1e-3, 1e-4, 1e-4, 1e-5, 1e-5], rtol=1e-6)
    solver.iter = 0
    scores = solver.test(0)                        # what the test at iteration 0 reports
    assert scores["accuracy"] == 0                 # every class ties: counted against
    loss = float32_mean([np.log(np.float32(101))] * 950)
    assert np.float32(scores["loss"]) == loss and loss != np.float32(np.log(101))

    solver.step(1)
    pe = np.full(101, 1 / 101)
    pe[3] -= 1
    dw, db = np.outer(pe, np.full(8, 50.0)), pe
    norm = np.sqrt(np.sum((2 * dw) ** 2) + np.sum((2 * db) ** 2))
    assert 281 < norm < 282
    w, b = (q.data for q in solver.net.params["fc-action"])
    np.testing.assert_allclose(w, -0.001 * (40 / norm) * dw, rtol=1e-5)
    np.testing.assert_allclose(b, -0.002 * (40 / norm) * db, rtol=1e-5)
    # clipping after Normalize would have moved them twice as far: that is not Caffe's order
    assert not np.allclose(w, -0.001 * (40 / (norm / 2)) * dw, rtol=1e-3)
    assert solver.test(0)["accuracy"] == 1         # after one update class 3 wins


# ---------------------------------------------------------------- LeNet multistep (BVLC)
LENET_STAND_IN = """name: "lenet-stand-in"
layer { name: "mnist" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 2 dim: 4 } shape { dim: 2 }
    data_filler { type: "constant" value: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def test_lenet_multistep_solver(tmp_path, monkeypatch):
    """lenet_multistep_solver.prototxt: ``multistep`` with gamma 0.9 at 5000, 7000, 8000,
    9000 and 9500, so 0.01, 0.009, 0.0081, 0.00729, 0.006561, 0.0059049.  Caffe's
    GetLearningRate moves current_step on by at most one per call (ApplyUpdate calls it
    once an iteration), so walking iterations 0..9999 changes the rate exactly there, while a
    solver put at 9600 without its state has step 1 after one call.  The snapshot at 5000
    (``<prefix>_iter_5000``, binary) holds current_step 0: the last update ran at 4999; a
    solver restored from it takes the 5000th update at 0.009, as the one that went on."""
    monkeypatch.chdir(tmp_path)
    write_stand_in("examples/mnist/lenet_train_test.prototxt", LENET_STAND_IN)
    solver = caffe.get_solver(MULTISTEP)
    p = solver.param
    assert (p.lr_policy, list(p.stepvalue), p.max_iter, p.snapshot) == \
        ("multistep", [5000, 7000, 8000, 9000, 9500], 10000, 5000)
    assert p.gamma == np.float32(0.9) and p.base_lr == np.float32(0.01)
    assert (p.test_iter[0], p.test_interval, p.display) == (100, 500, 100)
    rates = []
    for it in range(10000):
        solver.iter = it
        rates.append(solver.get_learning_rate())
    rates = np.array(rates)
    changes = np.flatnonzero(np.diff(rates)) + 1
    assert list(changes) == [5000, 7000, 8000, 9000, 9500]
    gamma, base = np.float64(np.float32(0.9)), np.float64(np.float32(0.01))
    np.testing.assert_allclose(rates[[0, 5000, 7000, 8000, 9000, 9500, 9999]],
                               [base * gamma ** k for k in (0, 1, 2, 3, 4, 5, 5)], rtol=1e-6)
    late = caffe.get_solver(MULTISTEP)
    late.iter = 9600
    np.testing.assert_allclose(late.get_learning_rate(), base * gamma, rtol=1e-6)
    assert late.current_step == 1

    on = caffe.get_solver(MULTISTEP)
    on.iter = 4999
    on.step(1)
    model = "examples/mnist/lenet_multistep_iter_5000.caffemodel"
    state = caffe_pb2.SolverState.FromString(open(model.replace(".caffemodel", ".solverstate"), "rb").read())
    assert (state.iter, state.current_step, state.learned_net) == (5000, 0, model)
    resumed = caffe.get_solver(MULTISTEP)
    resumed.restore(model.replace(".caffemodel", ".solverstate"))
    w, h = on.net.params["ip"][0].data.astype(np.float64), on.history[0].astype(np.float64)
    assert np.any(h)
    on.net.clear_param_diffs()
    on.net.forward()
    on.net.backward()
    g = on.net.params["ip"][0].diff.astype(np.float64)      # DummyData constant: the step's too
    on.step(1)
    resumed.step(1)
    assert on.current_step == resumed.current_step == 1
    # the update taken at 5000: 0.9 history + 0.009 (dW + 0.0005 W)
    np.testing.assert_allclose(on.net.params["ip"][0].data,
                               w - (0.9 * h + base * gamma * (g + 0.0005 * w)), rtol=1e-5, atol=1e-8)
    np.testing.assert_array_equal(resumed.net.params["ip"][0].data, on.net.params["ip"][0].data)


# ----------------------------------------------------------------- CIFAR-10 full (BVLC, V1)
def write_cifar_leveldbs(rng):
    """examples/cifar10's LevelDBs as convert_cifar_data writes them (Datums of 3 x 32 x 32
    bytes and a label, keys in order), four images each, and a mean.binaryproto (legacy
    num/channels/height/width, as compute_image_mean writes) -- written with plyvel and
    caffe_pb2, not with minicaffe's writers."""
    import plyvel
    imgs = rng.integers(0, 256, (4, 3, 32, 32), dtype=np.uint8)
    labels = [3, 1, 4, 1]
    for name in ("train", "test"):
        db = plyvel.DB(f"examples/cifar10/cifar10_{name}_leveldb", create_if_missing=True)
        for i in range(4):
            datum = caffe_pb2.Datum(channels=3, height=32, width=32, data=imgs[i].tobytes(),
                                    label=labels[i])
            db.put(f"{i:05d}".encode(), datum.SerializeToString())
        db.close()
    mean = rng.uniform(100, 150, (3, 32, 32)).astype(np.float32)
    blob = caffe_pb2.BlobProto(num=1, channels=3, height=32, width=32, data=mean.ravel())
    with open("examples/cifar10/mean.binaryproto", "wb") as f:
        f.write(blob.SerializeToString())
    return imgs, np.array(labels), mean


def lrn_within_channel(x, local_size, alpha, beta):
    """Caffe's WITHIN_CHANNEL LRN of (C, H, W) by hand: AVE pooling of x^2 over a
    local_size^2 window padded by (local_size - 1) / 2 (the padding counts, so every window
    divides by local_size^2), then x * (1 + alpha * that) ^ -beta."""
    pad = (local_size - 1) // 2
    sq = np.pad(x.astype(np.float64) ** 2, ((0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(sq, (local_size, local_size), axis=(1, 2))
    return x * (1 + alpha * win.sum(axis=(3, 4)) / local_size ** 2) ** -beta


def test_cifar10_full_v1_net(tmp_path, monkeypatch):
    """cifar10_full_train_test.prototxt as of 2014 (V1 ``layers``): Caffe's upgrade turns
    ``blobs_lr`` into lr_mult and ``weight_decay`` into decay_mult, param by param (conv1:
    lr 1, 2, decay unset; conv3, which has no blobs_lr, no ParamSpec at all; ip1: decay 250
    and 0), DATA into "Data" with LEVELDB (the default backend), the ``include: { phase }``
    rules kept.  Both data layers are named 'cifar': the TEST one's missing source is
    reported at its own block, line 16 (the TRAIN one at line 2).

    On four-image LevelDBs and a mean file, the TEST net reads batch 100 by looping over the
    database (image i % 4) less the mean; 32 -> conv1 32 -> pool1 (MAX 3/2, ceil) 16 ->
    pool2 (AVE) 8 -> pool3 4, so ip1 reads 64 * 4 * 4 = 1024.  The forward against NumPy:
    LRN WITHIN_CHANNEL divides alpha by local_size^2 = 9 at every place (the AVE pooling
    counts the padding), AVE pooling 16 -> 8 divides its last window by 2 x 3 (the overhang
    past the input does not count), accuracy and loss by hand."""
    monkeypatch.chdir(tmp_path)
    os.makedirs("examples/cifar10")
    param = upgrade_net(read_net_param(CIFAR_FULL))
    specs = {lp.name: [(s.lr_mult, s.decay_mult, s.HasField("decay_mult")) for s in lp.param]
             for lp in param.layer}
    assert specs["conv1"] == specs["conv2"] == [(1, 1, False), (2, 1, False)]
    assert specs["conv3"] == [] and specs["ip1"] == [(1, 250, True), (2, 0, True)]
    data = [lp for lp in param.layer if lp.name == "cifar"]
    assert [(lp.type, lp.include[0].phase, lp.data_param.backend) for lp in data] == \
        [("Data", caffe.TRAIN, caffe_pb2.DataParameter.LEVELDB),
         ("Data", caffe.TEST, caffe_pb2.DataParameter.LEVELDB)]
    assert [lp.type for lp in param.layer][-2:] == ["Accuracy", "SoftmaxWithLoss"]
    for phase, line, split in ((caffe.TEST, 16, "test"), (caffe.TRAIN, 2, "train")):
        with pytest.raises(FileNotFoundError) as e:
            caffe.Net(CIFAR_FULL, phase)
        assert str(e.value).startswith(f"{CIFAR_FULL}:{line}: layer 'cifar'"), str(e.value)
        assert f"examples/cifar10/cifar10_{split}_leveldb" in str(e.value)

    imgs, labels, mean = write_cifar_leveldbs(np.random.default_rng(91))
    net = caffe.Net(CIFAR_FULL, caffe.TEST)
    # DataLayer's tops: (batch_size, datum's C, H, W) and a label of (batch_size,)
    blobs, params = caffe_shapes(param, caffe.TEST, given={"cifar": [(100, 3, 32, 32), (100,)]})
    assert {n: tuple(net.blobs[n].shape) for n in blobs} == blobs
    assert {n: [tuple(q.shape) for q in ps] for n, ps in net.params.items()} == params
    assert [blobs[n][2] for n in ("conv1", "pool1", "pool2", "pool3")] == [32, 16, 8, 4]
    assert params["ip1"] == [(10, 1024), (10,)] and net.outputs == ["accuracy", "loss"]
    train = caffe.Net(CIFAR_FULL, caffe.TRAIN)
    tspecs = dict(zip(train.layer_names, train.param_specs))
    assert [(s.lr_mult, s.decay_mult) for s in tspecs["ip1"]] == [(1, 250), (2, 0)]
    assert [(s.lr_mult, s.decay_mult) for s in tspecs["conv3"]] == [(1, 1), (1, 1)]
    assert "accuracy" not in train.blobs

    randomize(net, seed=92)
    net.forward()
    b = net.blobs
    x = b["data"].data
    np.testing.assert_allclose(x, (imgs[np.arange(100) % 4] - mean).astype(np.float32), rtol=1e-6)
    np.testing.assert_array_equal(b["label"].data, labels[np.arange(100) % 4])
    for n in (0, 5):
        c1 = conv_layer(net, "conv1", x[n], pad=2)
        np.testing.assert_allclose(b["conv1"].data[n], c1, rtol=1e-4, atol=1e-3)
        p1 = relu(max_pool(c1, 3, 2, 0, 16))
        np.testing.assert_allclose(b["pool1"].data[n], p1, rtol=1e-4, atol=1e-3)
        n1 = lrn_within_channel(b["pool1"].data[n], 3, 5e-5, 0.75)
        np.testing.assert_allclose(b["norm1"].data[n], n1, rtol=1e-5, atol=1e-5)
        assert not np.allclose(n1, lrn_within_channel(b["pool1"].data[n], 3, 5e-5 * 9, 0.75))
        c2 = relu(conv_layer(net, "conv2", b["norm1"].data[n], pad=2))
        np.testing.assert_allclose(b["conv2"].data[n], c2, rtol=1e-4, atol=1e-3)
        p2 = ave_pool(b["conv2"].data[n].astype(np.float64), 3, 2, 0, 8)
        np.testing.assert_allclose(b["pool2"].data[n], p2, rtol=1e-5, atol=1e-5)
        corner = b["conv2"].data[n, :, 14:, 14:].astype(np.float64).sum(axis=(1, 2)) / 4
        np.testing.assert_allclose(b["pool2"].data[n, :, 7, 7], corner, rtol=1e-5, atol=1e-5)
        n2 = lrn_within_channel(b["pool2"].data[n], 3, 5e-5, 0.75)
        np.testing.assert_allclose(b["norm2"].data[n], n2, rtol=1e-5, atol=1e-5)
        c3 = relu(conv_layer(net, "conv3", n2, pad=2))
        np.testing.assert_allclose(b["conv3"].data[n], c3, rtol=1e-3, atol=1e-3)
        p3 = ave_pool(b["conv3"].data[n].astype(np.float64), 3, 2, 0, 4)
        np.testing.assert_allclose(b["pool3"].data[n], p3, rtol=1e-5, atol=1e-5)
    w, bias = (q.data.astype(np.float64) for q in net.params["ip1"])
    ip1 = b["pool3"].data.reshape(100, -1) @ w.T + bias
    np.testing.assert_allclose(b["ip1"].data, ip1, rtol=1e-4, atol=1e-4)
    logp = ip1 - ip1.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    lab = labels[np.arange(100) % 4]
    np.testing.assert_allclose(b["loss"].data, -logp[np.arange(100), lab].mean(), rtol=1e-4)
    np.testing.assert_allclose(b["accuracy"].data, np.mean(ip1.argmax(axis=1) == lab), rtol=1e-6)


CIFAR_STAND_IN_DATA = '''layers {
  name: "cifar"
  type: DUMMY_DATA
  top: "data"
  top: "label"
  dummy_data_param {
    num: 2 channels: 3 height: 8 width: 8
    num: 2 channels: 1 height: 1 width: 1
    data_filler { type: "constant" value: 50 }
    data_filler { type: "constant" value: 7 }
  }
}
'''


def test_cifar10_full_solvers_lr1_lr2_resume_from_hdf5(tmp_path, monkeypatch):
    """examples/cifar10/train_full.sh: the first solver (``fixed`` 0.001 to 60000, here the
    lr1 file with that rate, end and snapshot every 10000) snapshots in HDF5
    (``snapshot_format: HDF5``: <prefix>_iter_60000.caffemodel.h5 and .solverstate.h5, the
    state holding iter, current_step, learned_net and history/0..7); ``caffe train
    --solver=..._lr1.prototxt --snapshot=...60000.solverstate.h5`` goes on at 0.0001 to
    65000 with the history restored, and _lr2 from the 65000 snapshot at 0.00001 to 70000.

    The net is the V1 file with its Data layers replaced by a V1 DUMMY_DATA of 2 x 3 x 8 x 8
    (8 -> 4 -> 2 -> 1: pool3's window on 2 x 2 is ceil(-1 / 2) + 1 = 1).  The update taken
    at 60000, by hand for every param: history = 0.9 history + 0.0001 lr_mult (dW + 0.004
    decay_mult W), with ip1's decay_mult 250 and conv3's defaults (lr 1, decay 1)."""
    monkeypatch.chdir(tmp_path)
    v1 = read(CIFAR_FULL)
    body = v1[v1.index('layers {\n  name: "conv1"'):]
    write_stand_in("examples/cifar10/cifar10_full_train_test.prototxt",
                   v1[:v1.index("layers {")] + CIFAR_STAND_IN_DATA + body)
    lr1 = read(CIFAR_LR1)
    first = lr1.replace("base_lr: 0.0001\n", "base_lr: 0.001\n").replace(
        "max_iter: 65000\n", "max_iter: 60000\n").replace("snapshot: 5000\n", "snapshot: 10000\n")
    write_stand_in("examples/cifar10/cifar10_full_solver.prototxt", first)

    a = caffe.get_solver("examples/cifar10/cifar10_full_solver.prototxt")
    assert tuple(a.net.blobs["pool3"].shape) == (2, 64, 1, 1)
    assert tuple(a.net.params["ip1"][0].shape) == (10, 64)
    a.iter = 59999
    a.step(1)
    model = "examples/cifar10/cifar10_full_iter_60000.caffemodel.h5"
    state = "examples/cifar10/cifar10_full_iter_60000.solverstate.h5"
    with h5py.File(state, "r") as f:
        # hdf5_save_int: a 1-element dataset; hdf5_save_string: a string
        assert f["iter"].shape == f["current_step"].shape == (1,)
        assert (f["iter"][0], f["current_step"][0]) == (60000, 0)
        assert f["learned_net"][()].decode() == model
        assert sorted(f["history"], key=int) == [str(i) for i in range(8)]
    with h5py.File(model, "r") as f:       # Net::ToHDF5: a group for every layer, blobs or not
        assert sorted(f["data"]) == sorted(a.net.layer_names) and "diff" not in f
        assert list(f["data/pool1"]) == [] and f["data/ip1/0"].shape == (10, 64)

    b = caffe.get_solver(CIFAR_LR1)
    p = b.param
    assert (p.base_lr, p.max_iter, p.snapshot, p.lr_policy) == (np.float32(1e-4), 65000, 5000, "fixed")
    assert p.snapshot_format == caffe_pb2.SolverParameter.HDF5
    assert p.solver_mode == caffe_pb2.SolverParameter.CPU
    b.restore(state)
    assert b.iter == 60000
    keys = [(n, j) for n in b.net.params for j in range(len(b.net.params[n]))]
    for i, k in enumerate(keys):
        np.testing.assert_array_equal(b.history[i], a.history[i], err_msg=str(k))
        np.testing.assert_array_equal(b.net.params[k[0]][k[1]].data, a.net.params[k[0]][k[1]].data)
    w0 = {k: b.net.params[k[0]][k[1]].data.astype(np.float64) for k in keys}
    h0 = {k: b.history[i].astype(np.float64) for i, k in enumerate(keys)}
    b.net.clear_param_diffs()
    b.net.forward()
    b.net.backward()
    g = {k: b.net.params[k[0]][k[1]].diff.astype(np.float64) for k in keys}
    b.step(1)
    lr_mult = {"conv1": (1, 2), "conv2": (1, 2), "conv3": (1, 1), "ip1": (1, 2)}
    decay = {"conv1": (1, 1), "conv2": (1, 1), "conv3": (1, 1), "ip1": (250, 0)}
    for k in keys:
        update = 0.9 * h0[k] + 1e-4 * lr_mult[k[0]][k[1]] * (g[k] + 0.004 * decay[k[0]][k[1]] * w0[k])
        assert np.any(update)
        np.testing.assert_allclose(b.net.params[k[0]][k[1]].data, w0[k] - update, rtol=1e-5,
                                   atol=1e-9, err_msg=str(k))
        np.testing.assert_allclose(b.net.params[k[0]][k[1]].diff, update, rtol=1e-5, atol=1e-12)

    b.iter = 64999
    b.step(1)
    c = caffe.get_solver(CIFAR_LR2)
    c.restore("examples/cifar10/cifar10_full_iter_65000.solverstate.h5")
    assert (c.iter, c.param.max_iter) == (65000, 70000)
    np.testing.assert_allclose(c.get_learning_rate(), 1e-5, rtol=1e-6)
    np.testing.assert_array_equal(c.net.params["ip1"][0].data, b.net.params["ip1"][0].data)


# ------------------------------------------------------------------ R-CNN ILSVRC13 (BVLC)
def test_rcnn_ilsvrc13_deploy(tmp_path):
    """R-CNN's ILSVRC13 net: CaffeNet (``input_shape`` 10 x 3 x 227 x 227: conv1 55, pool1
    27, pool2 13, pool5 6, fc6 from 9216) whose classifier ``fc-rcnn`` holds the 200 class
    SVMs, no Softmax: the net's only output is fc-rcnn's scores.  No layer has a filler, so
    a fresh net is all zeros (caffe.proto's ``constant`` 0) and scores 0.

    pycaffe's Detector with R-CNN's settings (mean (104, 117, 123) in BGR, raw_scale 255,
    channel_swap (2, 1, 0), context_pad 16) on a 60 x 80 image, against detector.py's crop
    worked by hand: window (8, 10, 40, 60) grows by 227 / 195 about its centre (24.5, 35.5)
    to the box (5, 6, 44, 65), all inside the image: its 39 x 59 crop (the slice excludes
    ymax, xmax) fills the 227 x 227 input.  Window (0, 0, 59, 79) grows to (-5, -7, 65, 87):
    the box sticks out by 5 rows and 7 columns, so the 60 x 80 image, resized to round(61 *
    227 / 71) = 195 by round(81 * 227 / 95) = 194, is placed at (round(5 * 227 / 71),
    round(7 * 227 / 95)) = (16, 17) in a canvas of the mean in raw units."""
    fresh = caffe.Net(RCNN, caffe.TEST)
    blobs, params = check_shapes(fresh, RCNN, caffe.TEST)
    assert fresh.inputs == ["data"] and fresh.outputs == ["fc-rcnn"]
    assert [blobs[n][2] for n in ("conv1", "pool1", "pool2", "pool5")] == [55, 27, 13, 6]
    assert blobs["fc-rcnn"] == (10, 200) and params["fc-rcnn"] == [(200, 4096), (200,)]
    assert params["fc6"] == [(4096, 9216), (4096,)] and params["conv2"] == [(256, 48, 5, 5), (256,)]
    assert not any(np.any(q.data) for ps in fresh.params.values() for q in ps)
    fresh.blobs["data"].reshape(1, 3, 227, 227)
    fresh.reshape()
    assert not np.any(fresh.forward(data=np.ones((1, 3, 227, 227), np.float32))["fc-rcnn"])
    randomize(fresh, seed=101)
    weights = str(tmp_path / "rcnn.caffemodel")
    fresh.save(weights)
    del fresh

    from PIL import Image
    image = np.random.default_rng(102).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    path = str(tmp_path / "image.png")
    Image.fromarray(image).save(path)
    mean = np.array([104.0, 117.0, 123.0])
    det = caffe.Detector(RCNN, weights, mean=mean, raw_scale=255, channel_swap=(2, 1, 0),
                         context_pad=16)
    windows = np.array([[8, 10, 40, 60], [0, 0, 59, 79]])
    dets = det.detect_windows([(path, windows)])
    assert [d["filename"] for d in dets] == [path, path]
    assert [list(d["window"]) for d in dets] == windows.tolist()

    im = image.astype(np.float32) / 255
    crop_mean = mean[[2, 1, 0]] / 255                    # RGB, raw units
    first = caffe.io.resize_image(im[5:44, 6:65], (227, 227))
    second = np.ones((227, 227, 3), np.float32) * crop_mean
    second[16:211, 17:211] = caffe.io.resize_image(im[0:60, 0:80], (195, 194))
    batch = np.stack([c.transpose(2, 0, 1)[[2, 1, 0]] * 255 - mean[:, None, None]
                      for c in (first, second)]).astype(np.float32)
    det.blobs["data"].reshape(2, 3, 227, 227)
    det.reshape()
    ref = det.forward(data=batch)["fc-rcnn"]
    assert ref.shape == (2, 200) and np.abs(ref).max() > 0
    for d, r in zip(dets, ref):
        np.testing.assert_allclose(d["prediction"], r, rtol=1e-4, atol=1e-5 * np.abs(r).max())


# ---------------------------------------------------- HDF5 logistic regression (BVLC)
def write_hdf5_data(rng):
    """02-brewing-logreg.ipynb's data files, smaller: 25 training and 30 test 4-vectors
    (2 classes); train.txt lists train.h5 twice ("To show this off, we'll list the same data
    file twice"), test.h5 is gzip-compressed; labels stored as float32."""
    X = rng.standard_normal((25, 4)).astype(np.float32)
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(np.float32)
    Xt = rng.standard_normal((30, 4)).astype(np.float32)
    yt = (Xt[:, 0] + 0.5 * Xt[:, 1] > 0).astype(np.float32)
    d = os.path.abspath("examples/hdf5_classification/data")
    os.makedirs(d)
    with h5py.File(f"{d}/train.h5", "w") as f:
        f["data"], f["label"] = X, y
    with open(f"{d}/train.txt", "w") as f:
        f.write(f"{d}/train.h5\n{d}/train.h5\n")
    with h5py.File(f"{d}/test.h5", "w") as f:
        f.create_dataset("data", data=Xt, compression="gzip", compression_opts=1)
        f.create_dataset("label", data=yt, compression="gzip", compression_opts=1)
    with open(f"{d}/test.txt", "w") as f:
        f.write(f"{d}/test.h5\n")
    return X, y, Xt, yt


def softmax_grads(W, b, X, y):
    """SoftmaxWithLoss over InnerProduct for a batch (normalization VALID: / N)."""
    z = X @ W.T + b
    prob = np.exp(z - z.max(axis=1, keepdims=True))
    prob /= prob.sum(axis=1, keepdims=True)
    prob[np.arange(len(y)), y.astype(int)] -= 1
    return prob.T @ X / len(y), prob.sum(axis=0) / len(y)


def test_hdf5_classification_logreg(tmp_path, monkeypatch):
    """examples/hdf5_classification: train_val.prototxt's HDF5Data reads 10 rows a batch
    through the files its source lists, going on into the next file mid-batch and back to
    the first after the last (HDF5DataLayer::Next), so 6 batches over 25 + 25 rows are rows
    0..59 of X, X, X; fc1's params are lr 1 / decay 1 and lr 2 / decay 0; the TEST net has
    outputs loss and accuracy.

    solver.prototxt names the notebook's NetSpec nets (logreg_auto_train/test: HDF5Data,
    InnerProduct with xavier and no ParamSpec, Accuracy, SoftmaxWithLoss): ``step`` 0.01 x
    0.1 every 5000, momentum 0.9, weight_decay 0.0005 (the bias too), test_iter 250 at
    every 1000 from iteration 0.  Two updates by hand: h = 0.9 h + 0.01 (dW + 0.0005 W),
    W -= h, on rows 0..9 then 10..19; then the notebook's accuracy loop over the test net
    (int(30 / 10) = 3 forwards) is the accuracy of the trained weights."""
    monkeypatch.chdir(tmp_path)
    X, y, Xt, yt = write_hdf5_data(np.random.default_rng(111))
    rows = np.concatenate([X, X, X])
    net = caffe.Net(LOGREG, caffe.TRAIN)
    assert net.blobs["data"].shape == (10, 4) and net.blobs["label"].shape == (10,)
    for i in range(6):
        net.forward()
        np.testing.assert_array_equal(net.blobs["data"].data, rows[10 * i:10 * i + 10], err_msg=str(i))
        np.testing.assert_array_equal(net.blobs["label"].data, np.concatenate([y, y, y])[10 * i:10 * i + 10])
    specs = dict(zip(net.layer_names, net.param_specs))
    assert [(s.lr_mult, s.decay_mult) for s in specs["fc1"]] == [(1, 1), (2, 0)]
    assert not np.any(net.params["fc1"][1].data) and np.any(net.params["fc1"][0].data)
    test = caffe.Net(LOGREG, caffe.TEST)
    assert test.outputs == ["accuracy", "loss"]      # Net::Init: a std::set of names, sorted

    from minicaffe import layers as L

    def logreg(hdf5, batch_size):     # the notebook's, through minicaffe's NetSpec
        n = caffe.NetSpec()
        n.data, n.label = L.HDF5Data(batch_size=batch_size, source=hdf5, ntop=2)
        n.ip1 = L.InnerProduct(n.data, num_output=2, weight_filler=dict(type="xavier"))
        n.accuracy = L.Accuracy(n.ip1, n.label)
        n.loss = L.SoftmaxWithLoss(n.ip1, n.label)
        return n.to_proto()
    for split in ("train", "test"):
        with open(f"examples/hdf5_classification/logreg_auto_{split}.prototxt", "w") as f:
            f.write(str(logreg(f"examples/hdf5_classification/data/{split}.txt", 10)))
    solver = caffe.get_solver(LOGREG_SOLVER)
    p = solver.param
    assert (p.lr_policy, p.stepsize, p.max_iter, p.test_iter[0], p.test_interval) == \
        ("step", 5000, 10000, 250, 1000)
    rates = []
    for it in (0, 4999, 5000, 9999):
        solver.iter = it
        rates.append(solver.get_learning_rate())
    np.testing.assert_allclose(rates, [0.01, 0.01, 0.001, 0.001], rtol=1e-6)
    solver.iter = 0
    W, b = (q.data.astype(np.float64) for q in solver.net.params["ip1"])
    hw, hb = np.zeros_like(W), np.zeros_like(b)
    for i in range(2):
        gw, gb = softmax_grads(W, b, X[10 * i:10 * i + 10].astype(np.float64), y[10 * i:10 * i + 10])
        hw = 0.9 * hw + 0.01 * (gw + 0.0005 * W)
        hb = 0.9 * hb + 0.01 * (gb + 0.0005 * b)
        W, b = W - hw, b - hb
        solver.step(1)
        np.testing.assert_allclose(solver.net.params["ip1"][0].data, W, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(solver.net.params["ip1"][1].data, b, rtol=1e-5, atol=1e-7)
    tnet = solver.test_nets[0]
    batch_size = tnet.blobs["data"].num
    test_iters = int(len(Xt) / batch_size)
    accuracy = 0
    for _ in range(test_iters):
        tnet.forward()
        accuracy += tnet.blobs["accuracy"].data
    accuracy /= test_iters
    z = Xt @ W.T + b
    np.testing.assert_allclose(accuracy, np.mean(z.argmax(axis=1) == yt), rtol=1e-6)
