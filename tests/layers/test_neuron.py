"""ReLU, Sigmoid, TanH, Dropout: forward values, gradients, in-place runs, GPU parity."""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.proto import caffe_pb2
from minicaffe.rng import set_random_seed
from minicaffe.testing import check_gradient, make_blob, make_layer

SHAPE = (2, 3, 2, 3)


def away_from_zero(rng, shape=SHAPE, margin=0.1):
    """Values in [-2, -margin] U [margin, 2]: no kinks inside a finite difference."""
    mag = rng.uniform(margin, 2.0, size=shape)
    return mag * rng.choice([-1.0, 1.0], size=shape)


def run(text, x, dy, in_place=False, phase=None, xp=np, dtype=np.float64, seed=3):
    """Forward then backward; returns (top data, bottom diff, layer)."""
    layer = make_layer(text, xp=xp, dtype=dtype, phase=phase)
    bottom = make_blob(x, xp=xp, dtype=dtype, name="x")
    top = bottom if in_place else Blob(xp=xp, dtype=dtype, name="y")
    layer.setup([bottom], [top])
    set_random_seed(seed)
    layer.forward([bottom], [top])
    y = to_numpy(top.data).copy()
    top.diff[...] = xp.asarray(dy, dtype=dtype)
    layer.backward([top], [True], [bottom])
    return y, to_numpy(bottom.diff).copy(), layer


RELU = 'name: "relu" type: "ReLU"'
LEAKY = 'name: "relu" type: "ReLU" relu_param { negative_slope: 0.25 }'
SIGMOID = 'name: "sig" type: "Sigmoid"'
TANH = 'name: "tanh" type: "TanH"'
DROPOUT = 'name: "drop" type: "Dropout" dropout_param { dropout_ratio: 0.3 }'


# ------------------------------------------------------------------ forward
def test_relu_forward_values():
    x = np.array([[-2.0, -0.5, 0.0, 0.5, 3.0]])
    y, _, _ = run(RELU, x, np.zeros_like(x))
    np.testing.assert_array_equal(y, [[0, 0, 0, 0.5, 3.0]])
    y, _, _ = run(LEAKY, x, np.zeros_like(x))
    np.testing.assert_allclose(y, [[-0.5, -0.125, 0, 0.5, 3.0]])


def test_relu_backward_at_zero_is_zero():
    # Caffe: gradient passes where bottom > 0 only; at exactly 0 it is blocked
    # (slope 0) or scaled by negative_slope.
    x = np.array([[0.0, 1.0, -1.0]])
    _, dx, _ = run(RELU, x, np.ones_like(x))
    np.testing.assert_array_equal(dx, [[0, 1, 0]])
    _, dx, _ = run(LEAKY, x, np.ones_like(x))
    np.testing.assert_allclose(dx, [[0.25, 1, 0.25]])


def test_sigmoid_tanh_forward_against_formulas(rng):
    x = rng.uniform(-20, 20, size=SHAPE)
    y, _, _ = run(SIGMOID, x, np.zeros(SHAPE))
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-x)), rtol=1e-12, atol=1e-15)
    y, _, _ = run(TANH, x, np.zeros(SHAPE))
    np.testing.assert_allclose(y, np.tanh(x), rtol=1e-12)


def test_against_torch(rng):
    torch = pytest.importorskip("torch")
    x = away_from_zero(rng)
    dy = rng.standard_normal(SHAPE)
    for text, fn in ((RELU, torch.relu), (SIGMOID, torch.sigmoid), (TANH, torch.tanh),
                     (LEAKY, lambda t: torch.nn.functional.leaky_relu(t, 0.25))):
        tx = torch.tensor(x, requires_grad=True)
        ty = fn(tx)
        ty.backward(torch.tensor(dy))
        y, dx, _ = run(text, x, dy)
        np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-7, atol=1e-7)


# ---------------------------------------------------------------- gradients
@pytest.mark.parametrize("text", [RELU, LEAKY, SIGMOID, TANH])
def test_gradient(text, rng):
    layer = make_layer(text)
    check_gradient(layer, [make_blob(away_from_zero(rng))])


def test_dropout_gradient_train(rng):
    layer = make_layer(DROPOUT, phase=caffe_pb2.TRAIN)
    check_gradient(layer, [make_blob(rng.standard_normal(SHAPE))])


def test_dropout_gradient_test_phase(rng):
    layer = make_layer(DROPOUT, phase=caffe_pb2.TEST)
    check_gradient(layer, [make_blob(rng.standard_normal(SHAPE))])


# ------------------------------------------------------------------ in place
@pytest.mark.parametrize("text", [RELU, LEAKY, SIGMOID, TANH, DROPOUT])
def test_in_place_matches_out_of_place(text, rng):
    x = away_from_zero(rng)
    dy = rng.standard_normal(SHAPE)
    y0, dx0, _ = run(text, x, dy, in_place=False, phase=caffe_pb2.TRAIN)
    y1, dx1, _ = run(text, x, dy, in_place=True, phase=caffe_pb2.TRAIN)
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(dx0, dx1)


def test_negative_slope_reads_bottom_like_caffe():
    x = np.array([[-2.0, 3.0]])
    y, dx, layer = run('name: "r" type: "ReLU" relu_param { negative_slope: -0.5 }', x,
                       np.ones_like(x))
    np.testing.assert_allclose(y, [[1.0, 3.0]])
    np.testing.assert_allclose(dx, [[-0.5, 1.0]])
    assert layer.backward_reads() == BackwardReads(bottom=(0,), top=())


def test_backward_reads_declarations(rng):
    x = rng.standard_normal(SHAPE)
    for text in (RELU, LEAKY, SIGMOID, TANH):
        _, _, layer = run(text, x, x)
        assert layer.backward_reads() == BackwardReads(bottom=(), top=(0,))
        assert not layer.internals
    _, _, layer = run(DROPOUT, x, x, phase=caffe_pb2.TRAIN)
    assert layer.backward_reads() == BackwardReads(bottom=(), top=(), internals=("mask",))
    assert layer.internal("mask").dtype == np.uint32
    assert layer.internal("mask").shape == SHAPE
    _, _, layer = run(DROPOUT, x, x, phase=caffe_pb2.TEST)
    assert layer.backward_reads() == BackwardReads()
    assert not layer.internals


# ------------------------------------------------------------------- dropout
def test_dropout_train_scales_kept_and_zeroes_dropped():
    x = np.full((4, 50, 10, 10), 2.0)
    y, dx, layer = run(DROPOUT, x, np.ones_like(x), phase=caffe_pb2.TRAIN)
    mask = to_numpy(layer.internal("mask").data)
    scale = 1 / (1 - 0.3)
    np.testing.assert_allclose(y, 2.0 * scale * mask)
    np.testing.assert_allclose(dx, scale * mask)
    kept = mask.mean()
    assert abs(kept - 0.7) < 0.02  # 20000 draws: 5 sigma is about 0.016


def test_dropout_test_phase_is_identity(rng):
    x = rng.standard_normal(SHAPE)
    dy = rng.standard_normal(SHAPE)
    for in_place in (False, True):
        y, dx, _ = run(DROPOUT, x, dy, in_place=in_place, phase=caffe_pb2.TEST)
        np.testing.assert_array_equal(y, x)
        np.testing.assert_array_equal(dx, dy)


def test_dropout_same_seed_same_mask(rng):
    x = rng.standard_normal(SHAPE)
    y0, _, _ = run(DROPOUT, x, x, phase=caffe_pb2.TRAIN, seed=5)
    y1, _, _ = run(DROPOUT, x, x, phase=caffe_pb2.TRAIN, seed=5)
    y2, _, _ = run(DROPOUT, x, x, phase=caffe_pb2.TRAIN, seed=6)
    np.testing.assert_array_equal(y0, y1)
    assert not np.array_equal(y0, y2)


@pytest.mark.parametrize("ratio", ["0", "1", "1.5"])
def test_dropout_bad_ratio(ratio):
    layer = make_layer(f'name: "d" type: "Dropout" dropout_param {{ dropout_ratio: {ratio} }}')
    with pytest.raises(ValueError, match="dropout_ratio"):
        layer.setup([make_blob(np.zeros((2, 2)))], [Blob()])


# ----------------------------------------------------------------------- GPU
def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("text", [RELU, LEAKY, SIGMOID, TANH])
@pytest.mark.parametrize("in_place", [False, True])
def test_gpu_matches_cpu(cp, text, in_place):
    rng = np.random.default_rng(1)
    x = away_from_zero(rng, (4, 8, 5, 5)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    yc, dxc, _ = run(text, x, dy, in_place=in_place, dtype=np.float32)
    yg, dxg, _ = run(text, x, dy, in_place=in_place, xp=cp, dtype=np.float32)
    assert rel_err(yg, yc) <= 1e-5
    assert rel_err(dxg, dxc) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("in_place", [False, True])
def test_gpu_dropout(cp, in_place):
    # The device generator differs from the host one: check the GPU run against
    # its own mask, and the mask's keep rate.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 16, 10, 10)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    y, dx, layer = run(DROPOUT, x, dy, in_place=in_place, phase=caffe_pb2.TRAIN, xp=cp,
                       dtype=np.float32)
    mask = to_numpy(layer.internal("mask").data).astype(np.float32)
    scale = np.float32(1 / (1 - 0.3))
    assert rel_err(y, x * mask * scale) <= 1e-5
    assert rel_err(dx, dy * mask * scale) <= 1e-5
    assert abs(mask.mean() - 0.7) < 0.02
    y, dx, _ = run(DROPOUT, x, dy, in_place=in_place, phase=caffe_pb2.TEST, xp=cp,
                   dtype=np.float32)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(dx, dy)
