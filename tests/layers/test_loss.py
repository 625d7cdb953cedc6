"""EuclideanLoss: value, gradients to both bottoms, loss weight, shape checks, GPU parity."""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.testing import check_gradient, make_blob, make_layer

EUCLID = 'name: "l2" type: "EuclideanLoss"'


def setup(a, b, text=EUCLID, xp=np, dtype=np.float64):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(a, xp=xp, dtype=dtype, name="a"), make_blob(b, xp=xp, dtype=dtype,
                                                                    name="b")]
    top = [Blob(xp=xp, dtype=dtype, name="loss")]
    layer.setup(bottom, top)
    return layer, bottom, top


def test_hand_computed_value_and_gradients():
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    b = np.array([[0.0, 2.0], [5.0, 3.0]])
    layer, bottom, top = setup(a, b)
    loss = layer.forward(bottom, top)
    # (1 + 0 + 4 + 1) / (2 * 2)
    np.testing.assert_allclose(to_numpy(loss), 1.5)
    np.testing.assert_allclose(to_numpy(top[0].data), 1.5)
    layer.backward(top, [True, True], bottom)
    np.testing.assert_allclose(to_numpy(bottom[0].diff), (a - b) / 2)
    np.testing.assert_allclose(to_numpy(bottom[1].diff), -(a - b) / 2)


def test_against_torch_mse(rng):
    torch = pytest.importorskip("torch")
    a, b = rng.standard_normal((4, 3, 2)), rng.standard_normal((4, 6))  # same count per item
    layer, bottom, top = setup(a, b, EUCLID + " loss_weight: 3")
    loss = float(to_numpy(layer.forward(bottom, top)))
    layer.backward(top, [True, True], bottom)
    ta = torch.tensor(a, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True)
    ref = 3 * ((ta.reshape(4, 6) - tb) ** 2).sum() / (2 * 4)
    ref.backward()
    np.testing.assert_allclose(loss, float(ref.detach()), rtol=1e-12)
    np.testing.assert_allclose(to_numpy(bottom[0].diff), ta.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(to_numpy(bottom[1].diff), tb.grad.numpy(), rtol=1e-12)


def test_gradient(rng):
    layer = make_layer(EUCLID)
    bottom = [make_blob(rng.standard_normal((3, 2, 2))), make_blob(rng.standard_normal((3, 4)))]
    assert layer.allow_force_backward(1)  # both inputs may get a gradient, unlike other losses
    check_gradient(layer, bottom)


def test_declarations(rng):
    layer, _, _ = setup(rng.standard_normal((2, 3)), rng.standard_normal((2, 3)))
    assert layer.backward_reads() == BackwardReads(internals=("diff",))
    assert layer.internals["diff"].saved
    assert layer.loss_weights == [1.0]


@pytest.mark.parametrize("sa,sb,match", [((2, 3), (3, 2), "same first dimension"),
                                         ((2, 3), (2, 4), "same dimension")])
def test_shape_errors(sa, sb, match):
    with pytest.raises(ValueError, match=match):
        setup(np.zeros(sa), np.zeros(sb))


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
def test_gpu_matches_cpu(cp):
    rng = np.random.default_rng(8)
    a = rng.standard_normal((16, 10)).astype(np.float32)
    b = rng.standard_normal((16, 10)).astype(np.float32)
    outs = []
    for xp in (np, cp):
        layer, bottom, top = setup(a, b, EUCLID + " loss_weight: 0.5", xp=xp, dtype=np.float32)
        loss = to_numpy(layer.forward(bottom, top))
        layer.backward(top, [True, True], bottom)
        outs.append((np.atleast_1d(loss), to_numpy(bottom[0].diff), to_numpy(bottom[1].diff)))
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-5
