"""Softmax and SoftmaxWithLoss: torch references, normalization modes, ignore_label, gradients."""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.layers.softmax import FLT_MIN
from minicaffe.testing import check_gradient, make_blob, make_layer

SOFTMAX = 'name: "prob" type: "Softmax"'


def loss_text(loss_param="", extra=""):
    return f'name: "loss" type: "SoftmaxWithLoss" loss_param {{ {loss_param} }} {extra}'


def labels_for(rng, shape, classes, ignore=None, frac=0.3):
    lab = rng.integers(0, classes, size=shape).astype(np.float64)
    if ignore is not None:
        lab[rng.random(shape) < frac] = ignore
    return lab


def setup_loss(text, x, label, n_top=1, xp=np, dtype=np.float64):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(x, xp=xp, dtype=dtype, name="score"),
              make_blob(label, xp=xp, dtype=dtype, name="label")]
    top = [Blob(xp=xp, dtype=dtype, name=f"t{i}") for i in range(n_top)]
    layer.setup(bottom, top)
    return layer, bottom, top


def loss_and_grad(layer, bottom, top):
    loss = float(to_numpy(layer.forward(bottom, top)))
    layer.backward(top, [True, False], bottom)
    return loss, to_numpy(bottom[0].diff).copy()


# ------------------------------------------------------------------ Softmax
@pytest.mark.parametrize("axis,shape", [(1, (2, 5)), (1, (2, 4, 3, 2)), (-1, (2, 3, 4)),
                                        (0, (3, 2))])
def test_softmax_against_torch(axis, shape, rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal(shape) * 3
    dy = rng.standard_normal(shape)
    layer = make_layer(SOFTMAX + f" softmax_param {{ axis: {axis} }}")
    bottom, top = [make_blob(x)], [Blob(dtype=np.float64)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.softmax(tx, dim=axis)
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(to_numpy(top[0].data), ty.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(to_numpy(bottom[0].diff), tx.grad.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("axis,shape", [(1, (2, 3, 2, 2)), (2, (2, 2, 3))])
def test_softmax_gradient(axis, shape, rng):
    layer = make_layer(SOFTMAX + f" softmax_param {{ axis: {axis} }}")
    check_gradient(layer, [make_blob(rng.standard_normal(shape))])


def test_softmax_large_inputs_do_not_overflow():
    layer = make_layer(SOFTMAX, dtype=np.float32)
    bottom, top = [make_blob([[1000.0, 1000.0, -1000.0]], dtype=np.float32)], [Blob()]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    np.testing.assert_allclose(to_numpy(top[0].data), [[0.5, 0.5, 0.0]])


def test_softmax_in_place(rng):
    x = rng.standard_normal((2, 4, 3))
    dy = rng.standard_normal((2, 4, 3))
    outs = []
    for in_place in (False, True):
        layer = make_layer(SOFTMAX)
        b = make_blob(x)
        t = b if in_place else Blob(dtype=np.float64)
        layer.setup([b], [t])
        layer.forward([b], [t])
        y = to_numpy(t.data).copy()
        t.diff[...] = dy
        layer.backward([t], [True], [b])
        outs.append((y, to_numpy(b.diff).copy()))
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, rtol=1e-14)
    assert layer.backward_reads() == BackwardReads(bottom=(), top=(0,))


# --------------------------------------------------------- SoftmaxWithLoss
def torch_reference(x, label, ignore, reduction):
    torch = pytest.importorskip("torch")
    tx = torch.tensor(x, requires_grad=True)
    tl = torch.tensor(label.astype(np.int64))
    loss = torch.nn.functional.cross_entropy(
        tx, tl, ignore_index=-100 if ignore is None else ignore, reduction=reduction)
    loss.backward()
    return float(loss.detach()), tx.grad.numpy()


@pytest.mark.parametrize("shape", [(6, 5), (2, 4, 3, 2)])
@pytest.mark.parametrize("ignore", [None, 2])
@pytest.mark.parametrize("mode", ["VALID", "FULL", "BATCH_SIZE", "NONE"])
def test_loss_modes_against_torch(shape, ignore, mode, rng):
    x = rng.standard_normal(shape) * 2
    label_shape = (shape[0],) + shape[2:]
    label = labels_for(rng, label_shape, shape[1], ignore)
    lp = f"normalization: {mode}" + ("" if ignore is None else f" ignore_label: {ignore}")
    layer, bottom, top = setup_loss(loss_text(lp), x, label)
    loss, dx = loss_and_grad(layer, bottom, top)
    total, grad_sum = torch_reference(x, label, ignore, "sum")
    valid = label.size if ignore is None else int((label != ignore).sum())
    norm = {"VALID": valid, "FULL": label.size, "BATCH_SIZE": shape[0], "NONE": 1}[mode]
    np.testing.assert_allclose(loss, total / norm, rtol=1e-12)
    np.testing.assert_allclose(dx, grad_sum / norm, rtol=1e-10, atol=1e-14)
    if mode == "VALID":  # torch's "mean" is Caffe's VALID
        mean_loss, mean_grad = torch_reference(x, label, ignore, "mean")
        np.testing.assert_allclose(loss, mean_loss, rtol=1e-12)
        np.testing.assert_allclose(dx, mean_grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("lp,norm", [("normalize: false", "batch"), ("normalize: true", "valid"),
                                     ("", "valid"),
                                     ("normalize: false normalization: FULL", "full")])
def test_legacy_normalize_field(lp, norm, rng):
    x = rng.standard_normal((4, 3, 2))
    label = labels_for(rng, (4, 2), 3, ignore=1, frac=0.4)
    layer, bottom, top = setup_loss(loss_text(lp + " ignore_label: 1"), x, label)
    loss, _ = loss_and_grad(layer, bottom, top)
    total, _ = torch_reference(x, label, 1, "sum")
    n = {"batch": 4, "valid": int((label != 1).sum()), "full": 8}[norm]
    np.testing.assert_allclose(loss, total / n, rtol=1e-12)


@pytest.mark.parametrize("mode", ["VALID", "FULL", "BATCH_SIZE", "NONE"])
def test_loss_gradient(mode, rng):
    x = rng.standard_normal((3, 4, 2))
    label = np.array([[0, 2], [1, 1], [3, 0]], dtype=np.float64)
    layer = make_layer(loss_text(f"normalization: {mode} ignore_label: 1"))
    check_gradient(layer, [make_blob(x), make_blob(label)])


def test_all_labels_ignored_gives_zero_not_nan(rng):
    x = rng.standard_normal((3, 4))
    layer, bottom, top = setup_loss(loss_text("ignore_label: 7"), x, np.full(3, 7.0))
    loss, dx = loss_and_grad(layer, bottom, top)
    assert loss == 0.0
    np.testing.assert_array_equal(dx, 0.0)


def test_probability_clipped_at_flt_min():
    x = np.array([[0.0, 1000.0]])  # p[0] underflows to 0
    layer, bottom, top = setup_loss(loss_text(), x, np.array([0.0]))
    loss, _ = loss_and_grad(layer, bottom, top)
    np.testing.assert_allclose(loss, -np.log(FLT_MIN))


def test_loss_weight_scales_loss_and_gradient(rng):
    x = rng.standard_normal((4, 3))
    label = labels_for(rng, (4,), 3)
    layer, bottom, top = setup_loss(loss_text(), x, label)
    loss1, dx1 = loss_and_grad(layer, bottom, top)
    layer, bottom, top = setup_loss(loss_text(extra="loss_weight: 2.5"), x, label)
    loss2, dx2 = loss_and_grad(layer, bottom, top)
    np.testing.assert_allclose(loss2, 2.5 * loss1, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(top[0].data), loss1, rtol=1e-12)  # top holds the raw loss
    np.testing.assert_allclose(dx2, 2.5 * dx1, rtol=1e-12)


def test_second_top_is_prob(rng):
    x = rng.standard_normal((2, 3, 2))
    # As in Caffe, a loss layer with two tops needs a loss_weight for each.
    text = loss_text(extra="loss_weight: 1 loss_weight: 0")
    layer, bottom, top = setup_loss(text, x, labels_for(rng, (2, 2), 3), n_top=2)
    assert top[0].shape == () and top[1].shape == x.shape
    layer.forward(bottom, top)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(to_numpy(top[1].data), e / e.sum(axis=1, keepdims=True))


def test_softmax_axis(rng):
    x = rng.standard_normal((2, 3, 4))  # classes on the last axis
    label = labels_for(rng, (2, 3), 4)
    layer, bottom, top = setup_loss(loss_text(extra="softmax_param { axis: -1 }"), x, label)
    loss, dx = loss_and_grad(layer, bottom, top)
    ref, ref_grad = torch_reference(x.reshape(6, 4), label.reshape(6), None, "mean")
    np.testing.assert_allclose(loss, ref, rtol=1e-12)
    np.testing.assert_allclose(dx.reshape(6, 4), ref_grad, rtol=1e-10, atol=1e-14)


def test_declarations(rng):
    layer, bottom, top = setup_loss(loss_text(), rng.standard_normal((2, 3)), np.zeros(2))
    assert layer.backward_reads() == BackwardReads(bottom=(1,), internals=("prob",))
    assert layer.internals["prob"].saved and layer.internal("prob").shape == (2, 3)
    assert layer.allow_force_backward(0) and not layer.allow_force_backward(1)
    with pytest.raises(ValueError, match="cannot backpropagate to label"):
        layer.backward(top, [True, True], bottom)


@pytest.mark.parametrize("x_shape,label_shape,match", [
    ((4, 3), (5,), "same first dimension"),
    ((4, 3, 2), (4, 3), "number of labels must match"),
])
def test_label_shape_errors(x_shape, label_shape, match):
    with pytest.raises(ValueError, match=match):
        setup_loss(loss_text(), np.zeros(x_shape), np.zeros(label_shape))


# ----------------------------------------------------------------------- GPU
def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
def test_gpu_softmax_matches_cpu(cp):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((8, 10, 4, 4)) * 3).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    outs = []
    for xp in (np, cp):
        layer = make_layer(SOFTMAX, xp=xp, dtype=np.float32)
        b, t = make_blob(x, xp=xp, dtype=np.float32), Blob(xp=xp)
        layer.setup([b], [t])
        layer.forward([b], [t])
        t.diff[...] = xp.asarray(dy)
        layer.backward([t], [True], [b])
        outs.append((to_numpy(t.data), to_numpy(b.diff)))
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["VALID", "FULL", "BATCH_SIZE", "NONE"])
def test_gpu_loss_matches_cpu(cp, mode):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((8, 10, 3, 3)) * 3).astype(np.float32)
    label = labels_for(rng, (8, 3, 3), 10, ignore=4).astype(np.float32)
    outs = []
    for xp in (np, cp):
        layer, bottom, top = setup_loss(
            loss_text(f"normalization: {mode} ignore_label: 4", "loss_weight: 0.5 loss_weight: 0"),
            x, label, n_top=2, xp=xp, dtype=np.float32)
        loss, dx = loss_and_grad(layer, bottom, top)
        outs.append((np.array([loss]), dx, to_numpy(top[1].data)))
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-5
