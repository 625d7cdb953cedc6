"""scripts/torch_peer.py on whole networks: the PyTorch peer computes minicaffe's network.

Each case builds one prototxt twice, as a minicaffe Net (CPU, float64) and as its PyTorch peer
(float64), with random weights copied from the Net into the peer (``copy_from_net``), runs
forward on the same input and backward from the same top diff (the loss, or a random diff on
a deploy net's outputs), and compares every blob both have, the input's gradient and every
parameter gradient to 1e-9, relative to the blob's largest value.  The networks: the
project's own (``prototxt/<net>/dummy.prototxt``: AlexNet, VGG-16, GoogLeNet, ResNet-34/50)
and model-zoo files kept in ``tests/data`` (BVLC CaffeNet and GoogLeNet, SqueezeNet 1.0 and
1.1, ResNet-20 for CIFAR-10, soeaver's ResNet-18, DenseNet-121, MobileNet v1 and v2,
Xception): LRN, ceil and floor pooling, grouped and depthwise convolutions, BatchNorm+Scale
in TRAIN (batch statistics) and TEST (stored ones), Eltwise, Concat, Dropout, several
weighted losses.

Inputs are small: the data layers become Input layers of a batch of 1 or 2, at a smaller
image side wherever the net allows one (a fixed-size pool or InnerProduct after the last
convolution needs the original side).  In TRAIN, the peer's Dropout layers apply minicaffe's
own masks (the two draw different random numbers); in TEST the peer is left in PyTorch's
training mode, as built, so a TEST net's Dropout and BatchNorm must behave as TEST by
themselves.  TEST-phase BatchNorm statistics are set from the batch itself, layer by layer
(perturbed, with a variance floor), so that activations stay of order 1 through 50 layers;
with a few values per channel and no floor, the normalization amplifies rounding, and
MobileNet v2 at 64 x 64 differed by 1e-10 for that reason alone.

The smaller cases below each pin one rule where PyTorch's default differs from Caffe (see
the comments in scripts/torch_peer.py): the loss cap at -log(FLT_MIN), Eltwise MAX's ties,
and a BatchNorm whose top is read beside its Scale.  round_mode FLOOR is pinned by ResNet-18
and DenseNet-121 (their shapes differ under ceil).
"""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from minicaffe.net import Net  # noqa: E402
from minicaffe.netspec import L, NetSpec, P  # noqa: E402
from minicaffe.proto import caffe_pb2, parse_text, upgrade_net  # noqa: E402
from scripts.torch_peer import DATA_TYPES, TorchNet, copy_from_net  # noqa: E402

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST
TOL = 1e-9
ZOO = "tests/data/"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _net_param(path, fixes=()):
    """The NetParameter of ``path`` (relative to the repository), upgraded, with each (old,
    new) text substitution of ``fixes`` made first."""
    with open(os.path.join(REPO, path)) as f:
        text = f.read()
    for old, new in fixes:
        assert old in text, (path, old)
        text = text.replace(old, new)
    return upgrade_net(parse_text(text, caffe_pb2.NetParameter, path))


def _as_inputs(param, n, side):
    """Every data layer becomes an Input layer: its first top (n, C, side, side) with the
    layer's own C (3 for a Data layer), any other top (n,) (labels); include/exclude kept."""
    for lp in param.layer:
        if lp.type not in DATA_TYPES:
            continue
        c = lp.input_param.shape[0].dim[1] if lp.type == "Input" else 3
        tops, name = list(lp.top), lp.name
        include, exclude = list(lp.include), list(lp.exclude)
        lp.Clear()
        lp.name, lp.type = name, "Input"
        lp.top.extend(tops)
        lp.include.extend(include)
        lp.exclude.extend(exclude)
        for i in range(len(tops)):
            lp.input_param.shape.add().dim.extend([n, c, side, side] if i == 0 else [n])
    param.force_backward = True           # deploy nets: the data's diff, and no pruning
    return param


def _randomize(net, rng):
    """He-scaled weights (N(0, 2 / fan_in)), biases N(0, 0.1), Scale around 1, PReLU slopes
    in [0, 0.5]; BatchNorm statistics with the scale factor 0.5 (TEST: set by _calibrate)."""
    for layer in net.layers:
        blobs = net.params.get(layer.name)
        if not blobs:
            continue
        if layer.type == "BatchNorm":
            c = blobs[0].shape
            blobs[0].data[...] = rng.normal(0, 0.1, c) * 0.5
            blobs[1].data[...] = rng.uniform(0.5, 1.5, c) * 0.5
            blobs[2].data[...] = 0.5
        elif layer.type == "Scale":
            blobs[0].data[...] = rng.uniform(0.5, 1.5, blobs[0].shape)
            for b in blobs[1:]:
                b.data[...] = rng.normal(0, 0.2, b.shape)
        else:
            w = blobs[0]
            fan_in = w.data.size // w.shape[1 if layer.type == "Deconvolution" else 0]
            w.data[...] = rng.normal(0, np.sqrt(2.0 / fan_in), w.shape)
            for b in blobs[1:]:
                b.data[...] = rng.normal(0, 0.1, b.shape)


def _calibrate(net, rng):
    """TEST: each BatchNorm's stored statistics are its bottom's batch statistics (mean moved
    by 0.1 standard deviation, variance times [0.8, 1.25], floored by a tenth of the layer's
    mean variance and of mean^2), over the scale factor 0.5, set layer by layer in order."""
    for li, layer in enumerate(net.layers):
        if layer.type == "BatchNorm":
            x = net.blobs[net.bottom_names[layer.name][0]].data       # (N, C, H, W)
            axes = (0,) + tuple(range(2, x.ndim))
            mean, var = x.mean(axes), x.var(axes)
            var = (var + 0.1 * var.mean() + 0.1 * mean ** 2) * rng.uniform(0.8, 1.25, var.shape)
            mean = mean + 0.1 * np.sqrt(var) * rng.standard_normal(mean.shape)
            blobs = net.params[layer.name]
            blobs[0].data[...] = mean * 0.5
            blobs[1].data[...] = var * 0.5
            blobs[2].data[...] = 0.5
        net.forward_layer(li)


def _rel(a, b, floor=0.0):
    """max |a - b| / max(max |b|, floor)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    assert a.shape == b.shape
    scale = max(float(np.abs(b).max()) if b.size else 0.0, floor)
    d = float(np.abs(a - b).max()) if a.size else 0.0
    return d / scale if scale else d


def parity(param, phase, seed=0):
    """Forward and backward of ``param`` (inputs already small) in minicaffe and in its peer.

    Returns ({blob: relative difference}, {'data' or 'layer[i]': relative difference of the
    gradient}, the Net); asserts that the passes did something (a finite, nonzero input
    gradient)."""
    rng = np.random.default_rng(seed)
    net = Net(param, phase, mode="CPU", dtype=np.float64)
    _randomize(net, rng)
    x = rng.standard_normal(net.blobs["data"].shape)
    peer = TorchNet(param, phase).double()
    feeds = {"data": x}
    for name in net.inputs:
        if name != "data":                   # labels: below every classifier's count
            feeds[name] = rng.integers(0, peer.classes or 10,
                                       net.blobs[name].shape).astype(np.float64)
    for name, v in feeds.items():
        net.blobs[name].data[...] = v
    if phase == TEST:
        _calibrate(net, rng)
    copy_from_net(peer, net)
    net.clear_param_diffs()
    net.forward()
    assert peer.training                     # as built: TEST must not rely on eval()
    for layer in net.layers:                 # TRAIN: the peer drops what minicaffe dropped
        if layer.type == "Dropout" and phase == TRAIN:
            mask = torch.from_numpy(layer.internal("mask").data.astype(np.float64))
            peer.layer_modules[layer.name].forward = (
                lambda t, m=mask, s=layer.scale: t * m * s)
    xt = torch.from_numpy(x).requires_grad_()
    loss, blobs = peer(data=xt, **{k: torch.from_numpy(v) for k, v in feeds.items()
                                   if k != "data"})
    forward = {name: _rel(t.detach().numpy(), net.blobs[name].data)
               for name, t in blobs.items() if name in net.blobs and name not in feeds}
    if loss is not None:
        net.backward()
        loss.backward()
    else:                                    # a deploy net: the same random diff on its outputs
        diffs = {o: rng.standard_normal(net.blobs[o].shape) for o in net.outputs}
        net.backward(**diffs)
        torch.autograd.backward([blobs[o] for o in diffs],
                                [torch.from_numpy(d) for d in diffs.values()])
    dx = net.blobs["data"].diff
    assert np.isfinite(dx).all() and np.abs(dx).max() > 0, "no gradient reached the data"
    grads = {"data": _rel(xt.grad.numpy(), dx)}
    for layer, tensors in peer.layer_params.items():
        # relative to the layer's largest gradient: a convolution's bias before a TRAIN
        # BatchNorm has the gradient 0, which both compute as rounding noise
        floor = max(float(np.abs(b.diff).max()) for b in net.params[layer])
        for i, (t, b) in enumerate(zip(tensors, net.params[layer])):
            grads[f"{layer}[{i}]"] = _rel(t.grad.numpy(), b.diff, floor)
    return forward, grads, net


def _check(forward, grads, net, min_blobs):
    assert len(forward) >= min_blobs, sorted(forward)
    bad = {k: v for k, v in {**forward, **grads}.items() if not v <= TOL}
    assert not bad, bad


# name: (prototxt, text fixes, phase, batch, image side, least number of blobs compared)
_DENSENET = object()                     # tests/zoo7_nets.py writes it
CASES = {
    # the project's networks (scripts/gen_prototxt.py); the dummy data becomes inputs
    "alexnet-train": ("prototxt/alexnet/dummy.prototxt", (), TRAIN, 2, 63, 14),   # pool1 ceils
    "vgg16-train": ("prototxt/vgg16/dummy.prototxt", (), TRAIN, 2, 48, 20),       # pool5 ceils
    "googlenet-train": ("prototxt/googlenet/dummy.prototxt", (), TRAIN, 1, 224, 90),
    "resnet50-train": ("prototxt/resnet50/dummy.prototxt", (), TRAIN, 1, 224, 70),
    "resnet34-test": ("prototxt/resnet34/dummy.prototxt", (), TEST, 1, 224, 55),
    # model-zoo files
    "caffenet-deploy": (ZOO + "zoo11/caffenet/deploy.prototxt", (), TEST, 2, 63, 14),
    "bvlc-googlenet-test": (ZOO + "zoo6/googlenet/train_val.prototxt", (), TEST, 1, 224, 95),
    "squeezenet1.1-deploy": (ZOO + "zoo7/squeezenet/deploy_v1.1.prototxt", (), TEST, 2, 67, 35),
    "squeezenet1.0-train": (ZOO + "zoo5/squeezenet/train_val_v1.0.prototxt", (), TRAIN, 2, 67,
                            35),
    "resnet20-cifar-train": (ZOO + "zoo3/resnet_cifar10/resnet-20_trainval.prototxt", (), TRAIN,
                             2, 32, 30),
    "resnet20-cifar-test": (ZOO + "zoo3/resnet_cifar10/resnet-20_trainval.prototxt", (), TEST, 2,
                            32, 30),
    # a fork's `ceil_mode: false` spelled as upstream Caffe's round_mode
    "resnet18-deploy-floor": (ZOO + "zoo7/resnet18/deploy_resnet18-1x64d.prototxt",
                              (("ceil_mode: false", "round_mode: FLOOR"),), TEST, 1, 96, 30),
    "densenet121-deploy": (_DENSENET, (), TEST, 1, 224, 300),
    "mobilenet-deploy": (ZOO + "zoo5/mobilenet/mobilenet_deploy.prototxt", (), TEST, 1, 128, 50),
    "mobilenet2-deploy": (ZOO + "zoo5/mobilenet/mobilenet_v2_deploy.prototxt", (), TEST, 1, 128,
                          110),
    "xception-deploy": (ZOO + "zoo6/xception/deploy_xception.prototxt", (), TEST, 1, 107, 100),
}
SLOW = {
    "vgg16-train-224": ("prototxt/vgg16/dummy.prototxt", (), TRAIN, 1, 224, 20),
    "resnet50-train-224x2": ("prototxt/resnet50/dummy.prototxt", (), TRAIN, 2, 224, 70),
}


def _case(spec):
    path, fixes, phase, n, side, min_blobs = spec
    if path is _DENSENET:
        from zoo7_nets import densenet121_deploy
        param = upgrade_net(parse_text(densenet121_deploy(), caffe_pb2.NetParameter))
    else:
        param = _net_param(path, fixes)
    return _as_inputs(param, n, side), phase, min_blobs


@pytest.mark.parametrize("name", list(CASES))
def test_whole_network_forward_and_backward_as_minicaffe(name):
    param, phase, min_blobs = _case(CASES[name])
    _check(*parity(param, phase), min_blobs)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLOW))
def test_whole_network_at_224(name):
    param, phase, min_blobs = _case(SLOW[name])
    _check(*parity(param, phase), min_blobs)


def _small(data_shape, build, label_shape=None):
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=list(data_shape)))
    if label_shape is not None:
        n.label = L.Input(shape=dict(dim=list(label_shape)))
    build(n)
    param = n.to_proto()
    param.force_backward = True
    return param


def test_softmax_loss_is_capped_at_minus_log_flt_min_with_the_uncapped_gradient():
    """Caffe's loss of a sample is -log(max(p, FLT_MIN)), at most 87.34, and its gradient stays
    p - 1: logits scaled by 100 put some samples past the cap (PyTorch's cross_entropy alone
    gives their full -log p)."""
    def build(n):
        n.fc = L.InnerProduct(n.data, num_output=4, weight_filler=dict(type="gaussian", std=1))
        n.big = L.Power(n.fc, scale=100.0)
        n.loss = L.SoftmaxWithLoss(n.big, n.label)
    param = _small((3, 5), build, (3,))
    forward, grads, net = parity(param, TRAIN, seed=1)
    _check(forward, grads, net, 3)
    logits, label = net.blobs["big"].data, net.blobs["label"].data.astype(int)
    nll = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1) \
        - logits[np.arange(3), label]
    assert (nll > 87.34).any() and (nll < 87.33).any(), nll     # some samples capped, not all


def test_the_peers_softmax_loss_cap_and_its_gradient():
    peer = TorchNet(_small((1, 3), lambda n: setattr(n, "loss", L.SoftmaxWithLoss(
        n.data, n.label)), (1,))).double()
    x = torch.tensor([[0.0, 200.0, 0.0]], dtype=torch.float64, requires_grad=True)
    loss, _ = peer(data=x, label=torch.zeros(1, dtype=torch.float64))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-np.log(np.finfo(np.float32).tiny), rel=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), [[-1.0, 1.0, 0.0]], atol=1e-12)


def test_eltwise_max_ties_go_where_caffe_sends_them():
    """Caffe's Eltwise MAX gives a tie between bottoms 0 and 1 to bottom 1, and a later
    bottom only what it strictly exceeds; the whole gradient goes to the winner."""
    def build(n):
        n.data2 = L.Input(shape=dict(dim=[2, 3, 4, 4]))
        n.data3 = L.Input(shape=dict(dim=[2, 3, 4, 4]))
        n.max = L.Eltwise(n.data, n.data2, n.data3, operation=P.Eltwise.MAX)
        n.fc = L.InnerProduct(n.max, num_output=5, weight_filler=dict(type="gaussian", std=1))
        n.loss = L.SoftmaxWithLoss(n.fc, n.label)
    param = _small((2, 3, 4, 4), build, (2,))
    net = Net(param, TRAIN, mode="CPU", dtype=np.float64)
    peer = TorchNet(param, TRAIN).double()
    copy_from_net(peer, net)
    rng = np.random.default_rng(4)
    a = np.round(rng.standard_normal((2, 3, 4, 4)))        # integers: many ties
    b = np.round(rng.standard_normal((2, 3, 4, 4)))
    c = np.round(rng.standard_normal((2, 3, 4, 4)))
    y = rng.integers(0, 5, (2,)).astype(np.float64)
    assert (a == b).sum() > 5 and (c == np.maximum(a, b)).sum() > 5
    net.forward(data=a, data2=b, data3=c, label=y)
    net.backward()
    ts = [torch.from_numpy(v).requires_grad_() for v in (a, b, c)]
    loss, _ = peer(data=ts[0], data2=ts[1], data3=ts[2], label=torch.from_numpy(y))
    loss.backward()
    for t, name in zip(ts, ("data", "data2", "data3")):
        np.testing.assert_allclose(t.grad.numpy(), net.blobs[name].diff, rtol=1e-12,
                                   atol=1e-15, err_msg=name)


def test_a_batchnorm_top_read_beside_its_scale_keeps_the_normalized_data():
    """BatchNorm in place on conv, a Scale from conv to a new blob, and an Eltwise of both:
    Caffe's conv holds the normalized data; fusing the pair would leave it unnormalized."""
    def build(n):
        n.conv = L.Convolution(n.data, num_output=4, kernel_size=3, pad=1)
        n.bn = L.BatchNorm(n.conv, in_place=True)
        n.sc = L.Scale(n.bn, bias_term=True)
        n.sum = L.Eltwise(n.bn, n.sc)
        n.fc = L.InnerProduct(n.sum, num_output=5)
        n.loss = L.SoftmaxWithLoss(n.fc, n.label)
    param = _small((2, 3, 5, 5), build, (2,))
    for phase in (TRAIN, TEST):
        _check(*parity(param, phase), 4)


@pytest.mark.parametrize("side,refused", [(4, True), (5, False)])
def test_a_caffe_pooling_window_wholly_past_the_input_is_refused(side, refused):
    """Kernel 1, stride 2, no pad: Caffe rounds 4 up to 3 outputs, the last window starting
    at 4, past the input (minicaffe, as Caffe, gives it -FLT_MAX); PyTorch's ceil_mode drops
    it.  On 5 both give 3."""
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 2, side, side]))
    n.pool = L.Pooling(n.data, pool=P.Pooling.MAX, kernel_size=1, stride=2)
    param = n.to_proto()
    param.force_backward = True
    if refused:
        assert Net(param, TRAIN, mode="CPU").blobs["pool"].shape == (1, 2, 3, 3)
        with pytest.raises(NotImplementedError, match="layer 'pool': .* wholly outside"):
            TorchNet(param)
    else:
        _check(*parity(param, TRAIN), 1)
