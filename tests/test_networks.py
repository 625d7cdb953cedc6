"""The networks under prototxt/: generated, parsed, built and run.

Every network's DummyData variant is built in TRAIN and TEST at batch 2 (full
224x224 inputs: the architectures have fixed pooling windows and fc sizes),
and its loss and gradients must be finite. Parameter totals are checked
against the published models: Caffe's bvlc_alexnet, VGG-16, bvlc_googlenet,
and torchvision's ResNets, whose BatchNorm affine parameters are Caffe's Scale
layers (BatchNorm statistics are not parameters). The digits LeNet is trained
briefly from its LMDBs.
"""
import gc
import glob
import importlib.util
import os

import numpy as np
import pytest

import minicaffe
from minicaffe.backend import to_numpy
from minicaffe.proto import caffe_pb2, read_net_param, read_solver_param

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTOTXT = os.path.join(REPO, "prototxt")


def _load_generator():
    spec = importlib.util.spec_from_file_location(
        "gen_prototxt", os.path.join(REPO, "scripts", "gen_prototxt.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_generator()
NETWORKS = list(gen.NETWORKS)

# Learnable parameters (weights, biases, Scale's gamma/beta; not BatchNorm statistics).
PARAM_COUNTS = {
    "digits": 200 + 9_050 + 100_500 + 5_010,                     # conv1, conv2, ip1, ip2
    "cifar10_quick": 2_432 + 25_632 + 51_264 + 65_600 + 650,     # Caffe's cifar10_quick
    "alexnet": 60_965_224,             # bvlc_alexnet (grouped conv2/4/5)
    "googlenet": 6_998_552 + 3_188_840 + 3_190_888,  # main + aux classifiers 1 and 2
    "vgg16": 138_357_544,              # VGG_ILSVRC_16_layers == torchvision vgg16
    "resnet34": 21_797_672,            # torchvision resnet34
    "resnet50": 25_557_032 + 64,       # torchvision resnet50 + the conv1 bias of Caffe's model
    "resnet101": 44_549_160,           # torchvision resnet101 (conv1 has no bias)
    "resnet152": 60_192_808,           # torchvision resnet152
}

# Layer types in train_val.prototxt (two Data layers, one per phase).
LAYER_COUNTS = {
    "digits": dict(Data=2, Convolution=2, ReLU=3, Pooling=2, InnerProduct=2, Accuracy=1,
                   SoftmaxWithLoss=1),
    "cifar10_quick": dict(Data=2, Convolution=3, ReLU=3, Pooling=3, InnerProduct=2, Accuracy=1,
                          SoftmaxWithLoss=1),
    "alexnet": dict(Data=2, Convolution=5, ReLU=7, LRN=2, Pooling=3, InnerProduct=3, Dropout=2,
                    Accuracy=1, SoftmaxWithLoss=1),
    # 3 stem convs + 9 inceptions x 6 convs + 2 aux convs; 4 stem pools + 9 inception
    # pools + pool5 + 2 aux pools; 1 + 2x2 fc
    "googlenet": dict(Data=2, Convolution=59, ReLU=61, LRN=2, Pooling=16, Concat=9,
                      InnerProduct=5, Dropout=3, Accuracy=6, SoftmaxWithLoss=3),
    "vgg16": dict(Data=2, Convolution=13, ReLU=15, Pooling=5, InnerProduct=3, Dropout=2,
                  Accuracy=2, SoftmaxWithLoss=1),
    # conv1 + 2 per basic block (16) + 3 projections
    "resnet34": dict(Data=2, Convolution=36, BatchNorm=36, Scale=36, ReLU=33, Eltwise=16,
                     Pooling=2, InnerProduct=1, Accuracy=2, SoftmaxWithLoss=1),
    # conv1 + 3 per bottleneck + 4 projections; ReLU: conv1 + 3 per block
    "resnet50": dict(Data=2, Convolution=53, BatchNorm=53, Scale=53, ReLU=49, Eltwise=16,
                     Pooling=2, InnerProduct=1, Accuracy=2, SoftmaxWithLoss=1),
    "resnet101": dict(Data=2, Convolution=104, BatchNorm=104, Scale=104, ReLU=100, Eltwise=33,
                      Pooling=2, InnerProduct=1, Accuracy=2, SoftmaxWithLoss=1),
    "resnet152": dict(Data=2, Convolution=155, BatchNorm=155, Scale=155, ReLU=151, Eltwise=50,
                      Pooling=2, InnerProduct=1, Accuracy=2, SoftmaxWithLoss=1),
}

# Shapes a correct architecture produces at batch 2: (blob, shape).
SHAPES = {
    "digits": [("pool2", (2, 50, 2, 2)), ("ip2", (2, 10))],
    "cifar10_quick": [("pool3", (2, 64, 4, 4)), ("ip2", (2, 10))],
    "alexnet": [("conv1", (2, 96, 55, 55)), ("pool5", (2, 256, 6, 6)), ("fc8", (2, 1000))],
    "googlenet": [("inception_3a/output", (2, 256, 28, 28)),
                  ("inception_4a/output", (2, 512, 14, 14)),
                  ("loss1/ave_pool", (2, 512, 4, 4)), ("inception_5b/output", (2, 1024, 7, 7)),
                  ("pool5/7x7_s1", (2, 1024, 1, 1)), ("loss3/classifier", (2, 1000))],
    "vgg16": [("pool5", (2, 512, 7, 7)), ("fc8", (2, 1000))],
    "resnet34": [("res2c", (2, 64, 56, 56)), ("res5c", (2, 512, 7, 7)), ("pool5", (2, 512, 1, 1))],
    "resnet50": [("res2c", (2, 256, 56, 56)), ("res5c", (2, 2048, 7, 7)),
                 ("pool5", (2, 2048, 1, 1))],
    "resnet101": [("res4b22", (2, 1024, 14, 14)), ("pool5", (2, 2048, 1, 1))],
    "resnet152": [("res3b7", (2, 512, 28, 28)), ("res4b35", (2, 1024, 14, 14)),
                  ("pool5", (2, 2048, 1, 1))],
}


# --------------------------------------------------------- files on disk
def test_committed_prototxt_match_the_generator():
    stale = gen.check_all(PROTOTXT)
    assert not stale, f"run `python scripts/gen_prototxt.py`; out of date: {stale}"


def test_generator_is_deterministic():
    first = {k: gen.to_text(v) for k, v in gen.outputs().items()}
    second = {k: gen.to_text(v) for k, v in gen.outputs().items()}
    assert first == second
    assert len(first) == 3 * len(NETWORKS)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(PROTOTXT, "*", "*.prototxt"))),
                         ids=lambda p: os.path.relpath(p, PROTOTXT))
def test_every_file_parses(path):
    if os.path.basename(path) == "solver.prototxt":
        sp = read_solver_param(path)
        assert sp.net.startswith("prototxt/") and os.path.exists(os.path.join(REPO, sp.net))
        assert sp.snapshot_prefix.startswith("snapshots/")
        assert len(sp.test_iter) == 1 and sp.base_lr > 0 and sp.max_iter > 0
    else:
        net = read_net_param(path)
        assert net.name and len(net.layer) > 5
        names = [l.name for l in net.layer]
        data_layers = [l for l in net.layer if l.type in ("Data", "DummyData")]
        # the only repeated layer name is "data" (one Data layer per phase)
        assert len(names) - len(set(names)) == len(data_layers) - 1


@pytest.mark.parametrize("name", NETWORKS)
def test_layer_counts(name):
    net = read_net_param(os.path.join(PROTOTXT, name, "train_val.prototxt"))
    counts = {}
    for layer in net.layer:
        counts[layer.type] = counts.get(layer.type, 0) + 1
    assert counts == LAYER_COUNTS[name]


@pytest.mark.parametrize("name", NETWORKS)
def test_dummy_variant_is_train_val_with_other_inputs(name):
    def body(path):
        net = read_net_param(os.path.join(PROTOTXT, name, path))
        return [l for l in net.layer if l.type not in ("Data", "DummyData")]
    assert body("dummy.prototxt") == body("train_val.prototxt")


def test_resnet_layout_follows_the_published_deploy_files():
    net = gen.resnet(50, data="dummy")
    by_name = {l.name: l for l in net.layer}
    # projection shortcut first, stride 2 on the first 1x1 of res3a, Eltwise of the two
    order = [l.name for l in net.layer]
    assert order.index("res3a_branch1") < order.index("res3a_branch2a")
    assert list(by_name["res3a_branch2a"].convolution_param.stride) == [2]
    assert list(by_name["res3a_branch2b"].convolution_param.stride) == [1]
    assert list(by_name["res3a"].bottom) == ["res3a_branch1", "res3a_branch2c"]
    assert list(by_name["res3b"].bottom) == ["res3a", "res3b_branch2c"]
    for prefix in ("bn", "scale"):
        assert list(by_name[f"{prefix}3a_branch2b"].top) == ["res3a_branch2b"]
    assert by_name["scale3a_branch2b"].scale_param.bias_term
    assert not by_name["bn3a_branch2b"].batch_norm_param.HasField("use_global_stats")
    assert not by_name["res3a_branch2b"].convolution_param.bias_term
    assert by_name["conv1"].convolution_param.bias_term  # ResNet-50's conv1 keeps its bias
    assert not {l.name: l for l in gen.resnet(101).layer}["conv1"].convolution_param.bias_term
    pool5 = by_name["pool5"].pooling_param
    assert pool5.pool == caffe_pb2.PoolingParameter.AVE
    assert (pool5.kernel_size, pool5.stride) == (7, 1)
    names152 = {l.name for l in gen.resnet(152).layer}
    assert {"res3b7", "res4b35", "res5c", "res2c"} <= names152 and "res3c" not in names152


def test_googlenet_auxiliary_losses():
    net = gen.googlenet(data="dummy")
    losses = {l.name: (list(l.top), list(l.loss_weight)) for l in net.layer
              if l.type == "SoftmaxWithLoss"}
    assert losses == {"loss1/loss": (["loss1/loss1"], [pytest.approx(0.3)]),
                      "loss2/loss": (["loss2/loss2"], [pytest.approx(0.3)]),
                      "loss3/loss3": (["loss3/loss3"], [1.0])}


def test_build_takes_any_batch_and_input():
    net = gen.build("resnet50", batch=7)
    assert list(net.layer[0].dummy_data_param.shape[0].dim) == [7, 3, 224, 224]
    assert list(net.layer[0].dummy_data_param.shape[1].dim) == [7]
    net = gen.build("alexnet", batch=5, data="imagenet", test_batch=3)
    train, test = net.layer[0], net.layer[1]
    assert (train.data_param.batch_size, test.data_param.batch_size) == (5, 3)
    assert train.include[0].phase == caffe_pb2.TRAIN and test.include[0].phase == caffe_pb2.TEST
    assert train.transform_param.crop_size == 227 and train.transform_param.mirror
    assert not test.transform_param.mirror
    assert list(train.transform_param.mean_value) == [104, 117, 123]
    with pytest.raises(ValueError, match="data must be one of"):
        gen.build("vgg16", data="cifar")
    with pytest.raises(KeyError, match="known: digits"):
        gen.build("lenet")


# --------------------------------------------------------- build and run
def _dummy_at_batch(name, batch):
    """The committed dummy.prototxt with its batch dimension rewritten."""
    net = read_net_param(os.path.join(PROTOTXT, name, "dummy.prototxt"))
    for shape in net.layer[0].dummy_data_param.shape:
        shape.dim[0] = batch
    return net


def _use_unit_statistics(net):
    """BatchNorm with global statistics (TEST) of mean 0, variance 1.

    A freshly built net's statistics are all zero, which makes TEST-phase
    BatchNorm divide by sqrt(eps) in every layer and overflow a deep ResNet.
    """
    for layer in net.layers:
        if layer.type == "BatchNorm":
            layer.blobs[1].data[...] = 1
            layer.blobs[2].data[...] = 1


def _learnable_count(net):
    return sum(b.count for layer in net.layers if layer.type != "BatchNorm" for b in layer.blobs)


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
@pytest.mark.parametrize("name", NETWORKS)
def test_network_forward_backward(name, phase):
    minicaffe.set_random_seed(1)
    net = minicaffe.Net(_dummy_at_batch(name, 2), getattr(minicaffe, phase), mode="CPU")
    try:
        assert _learnable_count(net) == PARAM_COUNTS[name]
        if phase == "TEST":
            _use_unit_statistics(net)
        loss = float(to_numpy(net.forward_backward()))
        assert np.isfinite(loss) and loss > 0
        for blob, shape in SHAPES[name]:
            assert net.blobs[blob].shape == shape, blob
        first = next(l for l in net.layers if l.blobs)
        grad = to_numpy(first.blobs[0].diff)
        assert np.all(np.isfinite(grad)) and np.any(grad != 0)
        if phase == "TEST":
            assert "accuracy" in " ".join(net.outputs) or "top-1" in " ".join(net.outputs)
    finally:
        del net
        gc.collect()


# ------------------------------------------------------- digits training
def test_digits_trains_to_95_percent(tmp_path):
    from minicaffe.tools.make_digits import make_digits
    make_digits(str(tmp_path), verbose=False)
    net = read_net_param(os.path.join(PROTOTXT, "digits", "train_val.prototxt"))
    for layer in net.layer:
        if layer.type == "Data":
            layer.data_param.source = str(tmp_path / os.path.basename(layer.data_param.source))
    sp = read_solver_param(os.path.join(PROTOTXT, "digits", "solver.prototxt"))
    assert sp.solver_mode == caffe_pb2.SolverParameter.GPU and sp.random_seed == 1
    sp.solver_mode = caffe_pb2.SolverParameter.CPU
    sp.max_iter, sp.test_interval, sp.snapshot, sp.display = 300, 0, 0, 0
    sp.snapshot_after_train = False
    solver = minicaffe.get_solver(sp, net_param=net, verbose=False)
    solver.step(300)
    scores = solver.test(0)
    assert float(np.asarray(scores["accuracy"]).ravel()[0]) >= 0.95


# ------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("name", NETWORKS)
def test_network_gpu_matches_cpu(name, cp):
    """TEST-phase forward on the GPU equals the CPU one (same seed: fillers and
    DummyData draw on the host, so both nets see the same weights and data)."""
    outs = {}
    for mode in ("CPU", "GPU"):
        minicaffe.set_random_seed(3)
        net = minicaffe.Net(_dummy_at_batch(name, 2), minicaffe.TEST, mode=mode)
        _use_unit_statistics(net)
        loss = float(to_numpy(net.forward_from_to()))
        last = SHAPES[name][-1][0]
        outs[mode] = (loss, to_numpy(net.blobs[last].data).copy())
        del net
        gc.collect()
    (loss_c, out_c), (loss_g, out_g) = outs["CPU"], outs["GPU"]
    assert np.isfinite(loss_g)
    assert loss_g == pytest.approx(loss_c, rel=1e-3)
    scale = np.abs(out_c).max() + 1e-12
    assert np.abs(out_g - out_c).max() / scale < 1e-3
