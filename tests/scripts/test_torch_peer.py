"""scripts/torch_peer.py: the PyTorch peer is the prototxt's own network.

In float64 on the CPU, the peer with minicaffe's weights gives minicaffe's losses, tops and
parameter gradients (TRAIN phase, BatchNorm on batch statistics); on the project's networks
it has Caffe's blob shapes and parameter counts.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from minicaffe import caffe_pb2  # noqa: E402
from minicaffe.net import Net  # noqa: E402
from minicaffe.netspec import L, NetSpec, P  # noqa: E402
from scripts.torch_peer import TorchNet, copy_from_net  # noqa: E402

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


def small_net(dropout=False):
    """Every layer type the peer builds, at a size where each one matters: grouped and dilated
    convolutions, LRN, a max pool whose ceil rule adds a row (12 -> 6, not 5), BatchNorm+Scale
    in place, a lone Scale, Eltwise SUM with coefficients, PROD and MAX, Concat, a padded
    average pool with clipped windows, global pooling, InnerProduct from axis 1, two weighted
    losses, Sigmoid/TanH/leaky ReLU, Flatten and Softmax."""
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 4, 12, 12]))
    n.label = L.Input(shape=dict(dim=[2]))
    n.conv1 = L.Convolution(n.data, num_output=6, kernel_size=3, pad=1, group=2,
                            weight_filler=dict(type="gaussian", std=0.3),
                            bias_filler=dict(type="gaussian", std=0.1))
    n.relu1 = L.ReLU(n.conv1, in_place=True)
    n.norm1 = L.LRN(n.relu1, local_size=3, alpha=0.5, beta=0.75, k=2.0)
    n.pool1 = L.Pooling(n.norm1, pool=P.Pooling.MAX, kernel_size=3, stride=2)      # 12 -> 6
    n.conv2 = L.Convolution(n.pool1, num_output=6, kernel_size=3, pad=2, dilation=2,
                            bias_term=False, weight_filler=dict(type="gaussian", std=0.3))
    n.bn2 = L.BatchNorm(n.conv2, in_place=True)
    n.scale2 = L.Scale(n.bn2, in_place=True, bias_term=True,
                       filler=dict(type="gaussian", std=0.5),
                       bias_filler=dict(type="gaussian", std=0.5))
    n.relu2 = L.ReLU(n.scale2, in_place=True, negative_slope=0.1)
    n.conv3 = L.Convolution(n.pool1, num_output=6, kernel_size=1,
                            weight_filler=dict(type="gaussian", std=0.3))
    n.scale3 = L.Scale(n.conv3, bias_term=False, filler=dict(type="gaussian", std=1.0))
    n.sig3 = L.Sigmoid(n.scale3)
    n.tanh3 = L.TanH(n.conv3)
    n.sum = L.Eltwise(n.relu2, n.sig3, coeff=[1.0, -0.5])
    n.prod = L.Eltwise(n.sum, n.tanh3, operation=P.Eltwise.PROD)
    n.max = L.Eltwise(n.sum, n.tanh3, operation=P.Eltwise.MAX)
    n.cat = L.Concat(n.prod, n.max, n.sum)                                       # 18 channels
    n.pool2 = L.Pooling(n.cat, pool=P.Pooling.AVE, kernel_size=3, stride=2, pad=1)   # 6 -> 4
    x = n.pool2
    if dropout:
        x = n.drop = L.Dropout(n.pool2, dropout_ratio=0.5)
    n.fc = L.InnerProduct(x, num_output=5, weight_filler=dict(type="gaussian", std=0.3),
                          bias_filler=dict(type="gaussian", std=0.1))
    n.loss = L.SoftmaxWithLoss(n.fc, n.label)
    n.gpool = L.Pooling(n.cat, pool=P.Pooling.MAX, global_pooling=True)
    n.flat = L.Flatten(n.gpool)
    n.aux = L.InnerProduct(n.flat, num_output=5, weight_filler=dict(type="gaussian", std=0.3))
    n.aux_loss = L.SoftmaxWithLoss(n.aux, n.label, loss_weight=0.3)
    n.prob = L.Softmax(n.aux)
    return n.to_proto()


def _pair(param, phase=TRAIN, seed=0):
    net = Net(param, phase, mode="CPU", dtype=np.float64)
    peer = TorchNet(param, phase).double()
    copy_from_net(peer, net)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(net.blobs["data"].shape)
    y = rng.integers(0, 5, net.blobs["label"].shape).astype(np.float64)
    return net, peer, x, y


def _both_passes(param, seed=0):
    """Forward and backward of ``param`` in minicaffe and in its peer, on the same inputs and
    weights: (net, peer, the peer's loss, the peer's blobs)."""
    net, peer, x, y = _pair(param, seed=seed)
    net.blobs["data"].data[...] = x
    net.blobs["label"].data[...] = y
    net.clear_param_diffs()
    net.forward()
    net.backward()
    loss, blobs = peer(data=torch.from_numpy(x), label=torch.from_numpy(y))
    loss.backward()
    return net, peer, loss, blobs


def _assert_same_param_grads(net, peer):
    for layer, tensors in peer.layer_params.items():
        for i, (t, b) in enumerate(zip(tensors, net.params[layer])):
            np.testing.assert_allclose(t.grad.numpy().reshape(b.shape), b.diff, rtol=1e-8,
                                       atol=1e-12, err_msg=f"{layer} param {i}")


def test_same_losses_tops_and_gradients_as_minicaffe():
    net, peer, loss, blobs = _both_passes(small_net())
    # loss_weight is a proto float: 0.3 is 0.30000001192... in both nets
    aux = float(np.float32(0.3)) * float(net.blobs["aux_loss"].data)
    want = float(net.blobs["loss"].data) + aux
    assert float(loss.detach()) == pytest.approx(want, rel=1e-12)
    compared = 0
    for name, t in blobs.items():
        if name in net.blobs:
            np.testing.assert_allclose(t.detach().numpy().reshape(net.blobs[name].shape),
                                       net.blobs[name].data, rtol=1e-9, atol=1e-12,
                                       err_msg=f"blob {name}")
            compared += 1
    assert compared >= 20
    _assert_same_param_grads(net, peer)


def test_the_max_pool_keeps_caffes_ceil_row_and_the_lone_scale_has_params():
    peer = TorchNet(small_net())
    assert peer.blob_shapes["pool1"] == (2, 6, 6, 6)          # floor would give 5
    assert peer.blob_shapes["pool2"] == (2, 18, 4, 4)          # its last window starts at 6 < 6 + 1
    assert [tuple(t.shape) for t in peer.layer_params["scale3"]] == [(6,)]
    assert [tuple(t.shape) for t in peer.layer_params["scale2"]] == [(6,), (6,)]


def test_dropout_in_test_phase_is_the_identity_and_in_train_drops():
    param = small_net(dropout=True)
    net, peer, x, y = _pair(param, TEST)
    peer.eval()
    net.blobs["data"].data[...] = x
    net.blobs["label"].data[...] = y
    net.forward()
    _, blobs = peer(data=torch.from_numpy(x), label=torch.from_numpy(y))
    np.testing.assert_allclose(blobs["fc"].detach().numpy(), net.blobs["fc"].data, rtol=1e-9)
    train = TorchNet(param, TRAIN).double().train()
    torch.manual_seed(0)
    _, b = train(data=torch.from_numpy(x), label=torch.from_numpy(y))
    kept = b["drop"] != 0
    assert 0 < float(kept.double().mean()) < 1
    np.testing.assert_allclose(b["drop"][kept].detach().numpy(),
                               2 * b["pool2"][kept].detach().numpy())


@pytest.mark.parametrize("name,params", [("alexnet", 60_965_224), ("googlenet", 13_378_280),
                                         ("resnet50", 25_557_096)])
def test_project_networks_have_caffes_shapes(name, params):
    from scripts.gen_prototxt import build
    param = build(name, batch=2, data="dummy")
    peer = TorchNet(param)
    assert sum(p.numel() for p in peer.parameters()) == params
    net = Net(param, TRAIN, mode="CPU")
    for blob, shape in peer.blob_shapes.items():
        if blob in net.blobs and net.blobs[blob].shape != ():
            assert tuple(net.blobs[blob].shape) == shape, blob


def test_a_layer_without_a_peer_is_named():
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3, 4, 4]))
    n.out = L.MVN(n.data)
    with pytest.raises(NotImplementedError, match="layer 'out': type MVN"):
        TorchNet(n.to_proto())


@pytest.mark.parametrize("norm", ["VALID", "BATCH_SIZE", "FULL", "NONE"])
def test_softmax_loss_normalization_and_ignore_label_as_caffe(norm):
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3, 2, 2]))
    n.label = L.Input(shape=dict(dim=[2, 1, 2, 2]))
    n.loss = L.SoftmaxWithLoss(n.data, n.label, loss_param=dict(
        ignore_label=2, normalization=getattr(caffe_pb2.LossParameter, norm)))
    param = n.to_proto()
    param.force_backward = True
    net, peer, x, _ = _pair(param)
    y = np.array([0, 1, 2, 2, 1, 0, 2, 1], np.float64).reshape(2, 1, 2, 2)
    net.blobs["data"].data[...] = x
    net.blobs["label"].data[...] = y
    net.forward()
    net.backward()
    xt = torch.from_numpy(x).requires_grad_()
    loss, _ = peer(data=xt, label=torch.from_numpy(y))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(float(net.blobs["loss"].data), rel=1e-12)
    np.testing.assert_allclose(xt.grad.numpy(), net.blobs["data"].diff, rtol=1e-10, atol=1e-14)


def _cuda():
    return torch.cuda.is_available()


@pytest.mark.gpu
def test_the_peer_on_the_gpu_gives_the_cpu_losses_and_gradients():
    if not _cuda():
        pytest.skip("no CUDA device")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    net, cpu, x, y = _pair(small_net())
    gpu = TorchNet(small_net()).double()
    gpu.load_state_dict(cpu.state_dict())
    gpu = gpu.cuda()
    lc, _ = cpu(data=torch.from_numpy(x), label=torch.from_numpy(y))
    lg, _ = gpu(data=torch.from_numpy(x).cuda(), label=torch.from_numpy(y).cuda())
    lc.backward()
    lg.backward()
    assert float(lg.detach()) == pytest.approx(float(lc.detach()), rel=1e-10)
    for (name, a), b in zip(cpu.named_parameters(), gpu.parameters()):
        np.testing.assert_allclose(b.grad.cpu().numpy(), a.grad.numpy(), rtol=1e-8, atol=1e-12,
                                   err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("save_on_cpu", [False, True])
def test_bench_step_trains_the_prototxt_net_on_the_gpu(save_on_cpu):
    """The benchmark's step on the same network: the loss falls over a few SGD steps, with and
    without save_on_cpu."""
    if not _cuda():
        pytest.skip("no CUDA device")
    from scripts.bench_throughput import torch_training_step
    torch.manual_seed(0)
    step = torch_training_step("cifar10_quick", 8, save_on_cpu=save_on_cpu, arch="prototxt")
    losses = [float(step().detach()) for _ in range(30)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def more_layers_net():
    """Deconvolution, Crop, PReLU (per channel and shared), ELU, Power, AbsVal, BNLL, Exp, Log,
    Slice, Reshape, LRN WITHIN_CHANNEL and EuclideanLoss beside a SoftmaxWithLoss."""
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3, 6, 6]))
    n.label = L.Input(shape=dict(dim=[2]))
    g = dict(type="gaussian", std=0.3)
    n.conv = L.Convolution(n.data, num_output=4, kernel_size=3, pad=1, weight_filler=g,
                           bias_filler=g)
    n.prelu = L.PReLU(n.conv, filler=dict(type="gaussian", std=0.5, mean=0.2))
    n.up = L.Deconvolution(n.prelu, convolution_param=dict(
        num_output=4, kernel_size=4, stride=2, pad=1, group=2, weight_filler=g,
        bias_filler=g))                                                          # 6 -> 12
    n.crop = L.Crop(n.up, n.data, axis=2, offset=[3, 2])                       # 12 -> 6
    n.elu = L.ELU(n.crop, alpha=0.7)
    n.pow = L.Power(n.elu, power=2.0, scale=0.5, shift=1.5)
    n.shared = L.PReLU(n.pow, channel_shared=True)
    n.absval = L.AbsVal(n.crop)
    n.bnll = L.BNLL(n.absval)
    n.exp = L.Exp(n.bnll, base=2.0, scale=0.5, shift=-0.25)
    n.log = L.Log(n.exp, base=10.0, scale=2.0, shift=1.0)
    n.sum = L.Eltwise(n.shared, n.log)
    n.a, n.b = L.Slice(n.sum, axis=1, slice_point=[2], ntop=2)
    n.norm = L.LRN(n.a, local_size=3, alpha=0.3, beta=0.75, norm_region=P.LRN.WITHIN_CHANNEL)
    n.l2 = L.EuclideanLoss(n.norm, n.b, loss_weight=0.5)
    n.flat = L.Reshape(n.b, shape=dict(dim=[0, -1]))
    n.fc = L.InnerProduct(n.flat, num_output=5, weight_filler=g)
    n.loss = L.SoftmaxWithLoss(n.fc, n.label)
    return n.to_proto()


def test_more_layer_types_as_minicaffe():
    net, peer, loss, blobs = _both_passes(more_layers_net(), seed=3)
    want = float(net.blobs["loss"].data) + 0.5 * float(net.blobs["l2"].data)
    assert float(loss.detach()) == pytest.approx(want, rel=1e-11)
    for name in ("up", "crop", "elu", "pow", "shared", "bnll", "exp", "log", "a", "b", "norm",
                 "flat", "fc"):
        np.testing.assert_allclose(blobs[name].detach().numpy(), net.blobs[name].data,
                                   rtol=1e-9, atol=1e-12, err_msg=name)
    assert peer.blob_shapes["up"] == (2, 4, 12, 12) and peer.blob_shapes["crop"] == (2, 4, 6, 6)
    _assert_same_param_grads(net, peer)
