"""MVN: per channel and across channels, with and without variance, eps on the std,
Caffe's backward formula, gradients, legacy 4-d shapes, declarations, GPU parity."""
import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.testing import check_gradient, make_blob, make_layer


def mvn_text(params=""):
    return f'name: "mvn" type: "MVN" mvn_param {{ {params} }}'


def setup(text, x, xp=np, dtype=np.float64, in_place=False):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(x, xp=xp, dtype=dtype, name="in")]
    top = bottom if in_place else [Blob(xp=xp, dtype=dtype, name="out")]
    layer.setup(bottom, top)
    return layer, bottom, top


def reference(x, across=False, variance=True, eps=1e-9):
    """NumPy: rows are (n, c) channels, or items with across_channels; eps on the std."""
    n = x.shape[0]
    rows = x.reshape(n if across else n * x.shape[1], -1)
    y = rows - rows.mean(axis=1, keepdims=True)
    if variance:
        y = y / (np.sqrt((y * y).mean(axis=1, keepdims=True)) + eps)
    return y.reshape(x.shape)


@pytest.mark.parametrize("params,across,variance", [
    ("", False, True),
    ("across_channels: true", True, True),
    ("normalize_variance: false", False, False),
    ("normalize_variance: false across_channels: true", True, False),
])
def test_forward_matches_numpy(params, across, variance, rng):
    x = 3 * rng.standard_normal((2, 3, 4, 5)) + 1
    layer, bottom, top = setup(mvn_text(params), x)
    layer.forward(bottom, top)
    np.testing.assert_allclose(to_numpy(top[0].data), reference(x, across, variance),
                               rtol=1e-10, atol=1e-12)
    if variance:
        assert layer.backward_reads() == BackwardReads(top=(0,), internals=("variance",))
        assert layer.internals["variance"].saved
        assert not layer.internals["temp"].saved and not layer.internals["mean"].saved
        assert layer.internals["variance"].blob.shape == ((2,) if across else (6,))
    else:
        assert layer.backward_reads() == BackwardReads()
        assert set(layer.internals) == {"mean"} and not layer.internals["mean"].saved


def test_matches_torch_layer_norm_without_eps(rng):
    """across_channels is layer norm over (C, H, W) with eps moved outside the root."""
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((3, 2, 4, 4))
    layer, bottom, top = setup(mvn_text("across_channels: true eps: 0"), x)
    layer.forward(bottom, top)
    ref = torch.nn.functional.layer_norm(torch.tensor(x), (2, 4, 4), eps=0.0)
    np.testing.assert_allclose(to_numpy(top[0].data), ref.numpy(), rtol=1e-10, atol=1e-12)


def test_eps_is_added_to_the_std_not_the_variance():
    x = np.array([[[[1.0, 3.0]]]])                      # mean 2, std 1
    layer, bottom, top = setup(mvn_text("eps: 0.25"), x)
    layer.forward(bottom, top)
    np.testing.assert_allclose(to_numpy(top[0].data).ravel(), [-1 / 1.25, 1 / 1.25])
    np.testing.assert_allclose(to_numpy(layer.internal("variance").data), [1.25])


def test_backward_is_caffes_formula(rng):
    """With a large eps the difference from the exact gradient shows: Caffe divides by
    std + eps where the derivative of the std has std alone."""
    x = rng.standard_normal((2, 3, 2, 2))
    eps = 0.5
    layer, bottom, top = setup(mvn_text(f"eps: {eps}"), x)
    layer.forward(bottom, top)
    dy = rng.standard_normal(x.shape)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    y = reference(x, eps=eps).reshape(6, 4)
    g = dy.reshape(6, 4)
    xr = x.reshape(6, 4)
    std = np.sqrt(((xr - xr.mean(1, keepdims=True)) ** 2).mean(1, keepdims=True))
    caffe = (g - g.mean(1, keepdims=True) - y * (g * y).mean(1, keepdims=True)) / (std + eps)
    np.testing.assert_allclose(to_numpy(bottom[0].diff), caffe.reshape(x.shape), rtol=1e-12)
    exact = (g - g.mean(1, keepdims=True)) / (std + eps) \
        - (xr - xr.mean(1, keepdims=True)) / std * (g * y).mean(1, keepdims=True) / (std + eps)
    assert not np.allclose(caffe, exact, rtol=1e-3)


@pytest.mark.parametrize("params", ["", "across_channels: true", "normalize_variance: false",
                                    "across_channels: true normalize_variance: false"])
def test_gradient(params, rng):
    """At the default eps (1e-9) Caffe's formula is the gradient to float64 precision."""
    check_gradient(make_layer(mvn_text(params)), [make_blob(rng.standard_normal((2, 3, 2, 3)))])


@pytest.mark.parametrize("params", ["", "normalize_variance: false"])
def test_in_place_gives_the_same_results(params, rng):
    x = rng.standard_normal((2, 3, 3, 2))
    dy = rng.standard_normal(x.shape)
    results = []
    for in_place in (False, True):
        layer, bottom, top = setup(mvn_text(params), x, in_place=in_place)
        layer.forward(bottom, top)
        y = to_numpy(top[0].data).copy()
        top[0].diff[...] = dy
        layer.backward(top, [True], bottom)
        results.append((y, to_numpy(bottom[0].diff).copy()))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-13)


def test_legacy_4d_shapes(rng):
    """Caffe reshapes the top to (num, channels, height, width)."""
    x = rng.standard_normal((3, 4))
    layer, bottom, top = setup(mvn_text(), x)
    assert top[0].shape == (3, 4, 1, 1)
    layer.forward(bottom, top)
    np.testing.assert_allclose(to_numpy(top[0].data), 0.0, atol=1e-12)  # 1 value per channel
    with pytest.raises(ValueError, match=r"'mvn' of type MVN: takes a bottom of at most 4 axes"):
        setup(mvn_text(), np.zeros((2, 2, 2, 2, 2)))


# -------------------------------------------------------------------- GPU
def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("params", ["", "across_channels: true", "normalize_variance: false"])
def test_gpu_matches_cpu(cp, params):
    outs = []
    for xp in (np, cp):
        r = np.random.default_rng(6)
        layer, bottom, top = setup(mvn_text(params), r.standard_normal((8, 16, 7, 7)), xp=xp,
                                   dtype=np.float32)
        layer.forward(bottom, top)
        top[0].diff[...] = xp.asarray(r.standard_normal(top[0].shape), dtype=np.float32)
        layer.backward(top, [True], bottom)
        outs.append((to_numpy(top[0].data), to_numpy(bottom[0].diff)))
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-4
