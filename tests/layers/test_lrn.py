"""LRN across and within channels: torch and hand-computed references, gradient
checks, declarations, errors, GPU."""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.testing.gradient_check import check_gradient, make_blob, make_layer


def lrn_text(body="", name="norm"):
    return f'name: "{name}" type: "LRN" lrn_param {{ {body} }}'


def run(layer, x, xp=np, dtype=np.float64):
    bottom = [make_blob(x, xp=xp, dtype=dtype, name="in")]
    top = [Blob(xp=xp, dtype=dtype, name="out")]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return bottom, top


def within_reference(x, size, alpha, beta):
    """Caffe's sub-net, literally: AVE pooling of x^2 over size x size with pad
    (size-1)/2 (divisor size^2), power (1 + alpha * pooled)^-beta, product."""
    n, c, h, w = x.shape
    p = (size - 1) // 2
    sq = np.zeros((n, c, h + 2 * p, w + 2 * p))
    sq[:, :, p:p + h, p:p + w] = x * x
    pooled = np.zeros_like(x)
    for i in range(h):
        for j in range(w):
            pooled[:, :, i, j] = sq[:, :, i:i + size, j:j + size].sum(axis=(2, 3)) / size ** 2
    return x * (1.0 + alpha * pooled) ** -beta


@pytest.mark.parametrize("size,alpha,beta,k", [(5, 1e-4, 0.75, 1.0), (3, 0.5, 0.75, 2.0),
                                               (1, 2.0, 0.5, 1.0), (7, 1.5, 1.25, 0.5)])
def test_across_channels_matches_torch(size, alpha, beta, k, rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((2, 6, 4, 3))
    layer = make_layer(lrn_text(f"local_size: {size} alpha: {alpha} beta: {beta} k: {k}"))
    _, (top,) = run(layer, x)
    # torch's LocalResponseNorm also divides alpha by the size; alpha, beta and
    # k are float fields of the schema, so compare with the values the layer read.
    ref = torch.nn.functional.local_response_norm(torch.tensor(x), size, alpha=layer.alpha,
                                                  beta=layer.beta, k=layer.k)
    np.testing.assert_allclose(top.data, ref.numpy(), rtol=1e-12)
    np.testing.assert_allclose(layer.internal("scale").data ** -layer.beta * x, top.data)


def test_across_channels_hand_computed():
    # one pixel, channels (1, 2, 3), size 3, alpha 3 (alpha/n = 1), beta 1, k 1:
    # scale = 1 + (0+1+4), 1 + (1+4+9), 1 + (4+9+0) = 6, 15, 14
    x = np.array([1.0, 2.0, 3.0]).reshape(1, 3, 1, 1)
    layer = make_layer(lrn_text("local_size: 3 alpha: 3 beta: 1 k: 1"))
    _, (top,) = run(layer, x)
    np.testing.assert_allclose(layer.internal("scale").data.ravel(), [6.0, 15.0, 14.0])
    np.testing.assert_allclose(top.data.ravel(), [1 / 6, 2 / 15, 3 / 14])


def test_across_channels_backward_matches_torch(rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((2, 7, 3, 3))
    layer = make_layer(lrn_text("local_size: 5 alpha: 0.8 beta: 0.75 k: 2"))
    (bottom,), (top,) = run(layer, x)
    dy = rng.standard_normal(x.shape)
    top.diff[...] = dy
    bottom.diff[...] = 123.0  # overwritten
    layer.backward([top], [True], [bottom])
    tx = torch.tensor(x, requires_grad=True)
    torch.nn.functional.local_response_norm(tx, 5, alpha=layer.alpha, beta=layer.beta,
                                            k=layer.k).backward(torch.tensor(dy))
    np.testing.assert_allclose(bottom.diff, tx.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("size,alpha,beta", [(3, 0.5, 0.75), (5, 2.0, 0.6), (1, 1.0, 1.0)])
def test_within_channel_matches_caffe_subnet(size, alpha, beta, rng):
    x = rng.standard_normal((2, 3, 5, 4))
    layer = make_layer(lrn_text(f"local_size: {size} alpha: {alpha} beta: {beta} k: 7 "
                                "norm_region: WITHIN_CHANNEL"))
    _, (top,) = run(layer, x)
    # k plays no part within a channel
    np.testing.assert_allclose(top.data, within_reference(x, size, layer.alpha, layer.beta),
                               rtol=1e-12)


def test_within_channel_matches_torch_ops(rng):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = rng.standard_normal((2, 3, 6, 5))
    layer = make_layer(lrn_text("local_size: 3 alpha: 0.5 beta: 0.75 norm_region: WITHIN_CHANNEL"))
    (bottom,), (top,) = run(layer, x)
    tx = torch.tensor(x, requires_grad=True)
    pooled = F.avg_pool2d(tx * tx, 3, stride=1, padding=1, count_include_pad=True)
    ref = tx * (1 + layer.alpha * pooled) ** -layer.beta
    np.testing.assert_allclose(top.data, ref.detach().numpy(), rtol=1e-12)
    dy = rng.standard_normal(x.shape)
    top.diff[...] = dy
    layer.backward([top], [True], [bottom])
    ref.backward(torch.tensor(dy))
    np.testing.assert_allclose(bottom.diff, tx.grad.numpy(), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- gradients
@pytest.mark.parametrize("body", [
    "local_size: 5 alpha: 0.9 beta: 0.75",
    "local_size: 3 alpha: 0.5 beta: 1.5 k: 2",
    "local_size: 7 alpha: 2 beta: 0.5 k: 0.5",   # window wider than the channels
    "local_size: 1 alpha: 1 beta: 0.75",
    "local_size: 3 alpha: 0.7 beta: 0.75 norm_region: WITHIN_CHANNEL",
    "local_size: 5 alpha: 1.5 beta: 0.6 norm_region: WITHIN_CHANNEL",
])
def test_gradient(body, rng):
    layer = make_layer(lrn_text(body))
    check_gradient(layer, [make_blob(rng.standard_normal((2, 4, 3, 4)))])


# ------------------------------------------------------------- declarations
@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_backward_reads_and_internals(region, rng):
    layer = make_layer(lrn_text(f"norm_region: {region}"))
    run(layer, rng.standard_normal((2, 3, 4, 4)))
    reads = layer.backward_reads()
    assert reads.bottom == (0,) and reads.top == (0,) and reads.internals == ("scale",)
    scale = layer.internals["scale"]
    assert scale.saved and scale.blob.shape == (2, 3, 4, 4)


def test_defaults_are_caffe_s():
    layer = make_layer(lrn_text())
    run(layer, np.ones((1, 5, 1, 1)))
    assert (layer.size, layer.alpha, layer.beta, layer.k) == (5, 1.0, 0.75, 1.0)
    # one pixel of ones, 5 channels: scale = 1 + (number of channels in the window)/5
    np.testing.assert_allclose(layer.internal("scale").data.ravel(),
                               1 + np.array([3, 4, 5, 4, 3]) / 5.0)


def test_no_propagate_down_leaves_bottom_diff(rng):
    layer = make_layer(lrn_text())
    (bottom,), (top,) = run(layer, rng.standard_normal((1, 3, 2, 2)))
    bottom.diff[...] = 4
    layer.backward([top], [False], [bottom])
    assert (bottom.diff == 4).all()


@pytest.mark.parametrize("body,shape,message", [
    ("local_size: 4", (1, 3, 2, 2), "odd values for local_size"),
    ("local_size: 0", (1, 3, 2, 2), "odd values for local_size"),
    ("", (3, 2, 2), "must have 4 axes"),
])
def test_bad_params_raise_clear_errors(body, shape, message):
    layer = make_layer(lrn_text(body, name="badnorm"))
    with pytest.raises(ValueError, match=message) as err:
        run(layer, np.zeros(shape))
    assert "'badnorm'" in str(err.value)


# ----------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("body", [
    "local_size: 5 alpha: 0.0001 beta: 0.75",
    "local_size: 3 alpha: 0.5 beta: 1.5 k: 2",
    "local_size: 9 alpha: 2 beta: 0.5",
    "local_size: 3 alpha: 0.7 beta: 0.75 norm_region: WITHIN_CHANNEL",
    "local_size: 5 alpha: 1.5 beta: 0.6 norm_region: WITHIN_CHANNEL",
])
def test_gpu_matches_numpy(cp, body, rng):
    x = rng.standard_normal((3, 8, 7, 6)).astype(np.float32)
    cpu = make_layer(lrn_text(body))
    gpu = make_layer(lrn_text(body), xp=cp, dtype=np.float32)
    (cb,), (ct,) = run(cpu, x)
    (gb,), (gt,) = run(gpu, x, xp=cp, dtype=np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    ct.diff[...] = dy
    gt.diff[...] = cp.asarray(dy)
    cpu.backward([ct], [True], [cb])
    gpu.backward([gt], [True], [gb])
    pairs = [(gt.data, ct.data), (gpu.internal("scale").data, cpu.internal("scale").data),
             (gb.diff, cb.diff)]
    for g, c in pairs:
        g = to_numpy(g)
        assert np.abs(g - c).max() <= 1e-5 * np.abs(c).max()
