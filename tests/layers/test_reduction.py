"""Reduction and ArgMax: every operation, axis and coeff, ArgMax's top shapes and tie order,
gradients, Caffe's errors, declarations, GPU parity."""
import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.testing import check_gradient, make_blob, make_layer


def reduction_text(params=""):
    return f'name: "red" type: "Reduction" reduction_param {{ {params} }}'


def argmax_text(params=""):
    return f'name: "am" type: "ArgMax" argmax_param {{ {params} }}'


def setup(text, x, xp=np, dtype=np.float64):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(x, xp=xp, dtype=dtype, name="in")]
    top = [Blob(xp=xp, dtype=dtype, name="out")]
    layer.setup(bottom, top)
    return layer, bottom, top


# -------------------------------------------------------------- Reduction
OPS = {"SUM": lambda x: x.sum(-1), "ASUM": lambda x: np.abs(x).sum(-1),
       "SUMSQ": lambda x: (x * x).sum(-1), "MEAN": lambda x: x.mean(-1)}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("axis,coeff", [(0, 1.0), (1, 1.0), (-1, 2.5), (2, -0.5)])
def test_reduction_forward_matches_numpy(op, axis, coeff, rng):
    shape = (2, 3, 4)
    x = rng.standard_normal(shape)
    layer, bottom, top = setup(reduction_text(f"operation: {op} axis: {axis} coeff: {coeff}"), x)
    layer.forward(bottom, top)
    a = axis % 3
    assert top[0].shape == shape[:a]                 # keeps the axes before `axis`
    expected = coeff * OPS[op](x.reshape(int(np.prod(shape[:a])), -1)).reshape(shape[:a])
    np.testing.assert_allclose(to_numpy(top[0].data), expected, rtol=1e-12)
    reads = (0,) if op in ("ASUM", "SUMSQ") else ()
    assert layer.backward_reads() == BackwardReads(bottom=reads)
    assert layer.internals == {}


def test_reduction_defaults_are_sum_of_everything(rng):
    x = rng.standard_normal((2, 3))
    layer, bottom, top = setup(reduction_text(), x)
    layer.forward(bottom, top)
    assert top[0].shape == ()
    np.testing.assert_allclose(to_numpy(top[0].data), x.sum(), rtol=1e-12)


@pytest.mark.parametrize("op", list(OPS))
def test_reduction_backward_matches_torch(op, rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((3, 2, 4))
    x[0, 0, 0] = 0.0                                    # sign(0) = 0, in Caffe and torch
    layer, bottom, top = setup(reduction_text(f"operation: {op} axis: 1 coeff: 3"), x)
    layer.forward(bottom, top)
    dy = rng.standard_normal(top[0].shape)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    tx = torch.tensor(x, requires_grad=True)
    flat = tx.reshape(3, -1)
    ref = {"SUM": flat.sum(1), "ASUM": flat.abs().sum(1), "SUMSQ": (flat ** 2).sum(1),
           "MEAN": flat.mean(1)}[op] * 3
    np.testing.assert_allclose(to_numpy(top[0].data), ref.detach().numpy(), rtol=1e-12)
    ref.backward(torch.tensor(dy))
    np.testing.assert_allclose(to_numpy(bottom[0].diff), tx.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_reduction_gradient(op, axis, rng):
    x = rng.standard_normal((2, 3, 2))
    x += np.where(x >= 0, 0.1, -0.1)                    # keep ASUM away from its kink
    check_gradient(make_layer(reduction_text(f"operation: {op} axis: {axis} coeff: 0.7")),
                   [make_blob(x)])


@pytest.mark.parametrize("axis", [3, -4])
def test_reduction_axis_out_of_range(axis):
    with pytest.raises(ValueError, match=f"'red' of type Reduction: axis {axis} out of range"):
        setup(reduction_text(f"axis: {axis}"), np.zeros((2, 3, 4)))


# ----------------------------------------------------------------- ArgMax
def caffe_argmax(x, top_k, out_max_val, axis=None):
    """Caffe's loop, written out: (value, index) pairs sorted by std::greater."""
    if axis is None:
        n = x.shape[0]
        flat = x.reshape(n, -1)
        shape = [1] * max(x.ndim, 3)
        shape[0], shape[1], shape[2] = n, 2 if out_max_val else 1, top_k
        out = np.zeros((n, 2 if out_max_val else 1, top_k))
        for i in range(n):
            ranked = sorted(((v, j) for j, v in enumerate(flat[i])), reverse=True)[:top_k]
            out[i, 0] = [j for _, j in ranked]
            if out_max_val:
                out[i, 1] = [v for v, _ in ranked]
        return out.reshape(shape)
    moved = np.moveaxis(x, axis, -1)
    out = np.zeros(moved.shape[:-1] + (top_k,))
    for idx in np.ndindex(*moved.shape[:-1]):
        ranked = sorted(((v, j) for j, v in enumerate(moved[idx])), reverse=True)[:top_k]
        out[idx] = [v if out_max_val else j for v, j in ranked]
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("params,shape,axis", [
    ("", (3, 4, 2, 2), None),
    ("top_k: 3", (3, 4, 2, 2), None),
    ("out_max_val: true top_k: 2", (3, 5), None),
    ("axis: 1", (2, 5, 3), 1),
    ("axis: 1 top_k: 3 out_max_val: true", (2, 5, 3), 1),
    ("axis: -1 top_k: 2", (2, 3, 6), 2),
    ("axis: 0 top_k: 2", (4, 3), 0),
])
def test_argmax_matches_caffes_loop(params, shape, axis, rng):
    x = rng.integers(0, 4, size=shape).astype(np.float64)   # many ties
    layer, bottom, top = setup(argmax_text(params), x)
    layer.forward(bottom, top)
    p = layer.param.argmax_param
    expected = caffe_argmax(x, p.top_k, p.out_max_val, axis)
    assert top[0].shape == expected.shape
    np.testing.assert_array_equal(to_numpy(top[0].data), expected)


def test_argmax_top_shapes_without_axis():
    """Without axis: (N, 1 or 2, top_k) padded with ones to the bottom's axes (at least 3)."""
    for shape, params, expected in [((2, 3, 4, 5), "top_k: 2", (2, 1, 2, 1)),
                                    ((2, 3, 4, 5), "out_max_val: true", (2, 2, 1, 1)),
                                    ((2, 7), "", (2, 1, 1)),
                                    ((6,), "", (6, 1, 1))]:
        _, _, top = setup(argmax_text(params), np.zeros(shape))
        assert top[0].shape == expected, (shape, params)


def test_argmax_ties_pick_the_last_index():
    layer, bottom, top = setup(argmax_text("top_k: 3 out_max_val: true"),
                               np.array([[1.0, 3.0, 3.0, 0.0, 3.0]]))
    layer.forward(bottom, top)
    np.testing.assert_array_equal(to_numpy(top[0].data).reshape(2, 3), [[4, 2, 1], [3, 3, 3]])


def test_argmax_matches_torch_topk_without_ties(rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((3, 6, 4))
    layer, bottom, top = setup(argmax_text("axis: 1 top_k: 3"), x)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(to_numpy(top[0].data),
                                  torch.topk(torch.tensor(x), 3, dim=1).indices.numpy())


def test_argmax_has_no_backward(rng):
    layer, bottom, top = setup(argmax_text(), rng.standard_normal((2, 3)))
    assert not layer.allow_force_backward(0)
    assert layer.backward_reads() == BackwardReads()
    layer.forward(bottom, top)
    with pytest.raises(NotImplementedError, match="'am' of type ArgMax has no backward"):
        layer.backward(top, [True], bottom)


@pytest.mark.parametrize("params,shape,match", [
    ("top_k: 0", (2, 3), "top k must not be less than 1"),
    ("top_k: 4", (2, 3), r"top_k \(4\) must be less than or equal to the dimension of the "
                         r"flattened bottom blob per instance \(3"),
    ("axis: 1 top_k: 4", (2, 3, 5), r"top_k \(4\) must be less than or equal to the dimension "
                                    r"of axis 1 \(3\)"),
    ("axis: 3", (2, 3, 5), "axis 3 out of range for bottom 'in'"),
])
def test_argmax_errors(params, shape, match):
    with pytest.raises(ValueError, match=match) as e:
        setup(argmax_text(params), np.zeros(shape))
    assert "'am'" in str(e.value)


# -------------------------------------------------------------------- GPU
def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("params", ["operation: SUM axis: 1", "operation: ASUM axis: 2",
                                    "operation: SUMSQ coeff: 0.5", "operation: MEAN axis: -1"])
def test_gpu_reduction_matches_cpu(cp, params):
    outs = []
    for xp in (np, cp):
        r = np.random.default_rng(4)
        layer, bottom, top = setup(reduction_text(params), r.standard_normal((8, 16, 5, 5)),
                                   xp=xp, dtype=np.float32)
        layer.forward(bottom, top)
        top[0].diff[...] = xp.asarray(r.standard_normal(top[0].shape), dtype=np.float32)
        layer.backward(top, [True], bottom)
        outs.append((np.atleast_1d(to_numpy(top[0].data)), to_numpy(bottom[0].diff)))
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("params", ["", "top_k: 4 out_max_val: true", "axis: 1 top_k: 3",
                                    "axis: -1 out_max_val: true"])
def test_gpu_argmax_matches_cpu(cp, params):
    """Integer-valued inputs: many ties, which must rank the same way on both."""
    x = np.random.default_rng(5).integers(0, 5, size=(8, 10, 4, 4))
    outs = []
    for xp in (np, cp):
        layer, bottom, top = setup(argmax_text(params), x, xp=xp, dtype=np.float32)
        layer.forward(bottom, top)
        outs.append(to_numpy(top[0].data))
    np.testing.assert_array_equal(outs[1], outs[0])
