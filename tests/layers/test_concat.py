"""Concat: shapes along any axis, legacy concat_dim, gradients, shape errors, GPU parity."""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.testing import check_gradient, make_blob, make_layer


def concat_text(params=""):
    return f'name: "cat" type: "Concat" concat_param {{ {params} }}'


def setup(text, shapes, rng, xp=np, dtype=np.float64):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(rng.standard_normal(s), xp=xp, dtype=dtype, name=f"in{i}")
              for i, s in enumerate(shapes)]
    top = [Blob(xp=xp, dtype=dtype, name="out")]
    layer.setup(bottom, top)
    return layer, bottom, top


@pytest.mark.parametrize("params,shapes,axis", [
    ("", [(2, 3, 2, 2), (2, 1, 2, 2), (2, 4, 2, 2)], 1),
    ("axis: 0", [(2, 3, 2), (1, 3, 2)], 0),
    ("axis: -1", [(2, 3, 2), (2, 3, 5)], 2),
    ("concat_dim: 0", [(1, 3), (4, 3)], 0),
    ("concat_dim: 1", [(2, 1, 3), (2, 2, 3)], 1),
])
def test_forward_matches_numpy(params, shapes, axis, rng):
    layer, bottom, top = setup(concat_text(params), shapes, rng)
    layer.forward(bottom, top)
    expected = np.concatenate([to_numpy(b.data) for b in bottom], axis=axis)
    assert top[0].shape == expected.shape
    np.testing.assert_array_equal(to_numpy(top[0].data), expected)
    assert layer.backward_reads() == BackwardReads()


@pytest.mark.parametrize("params,shapes", [
    ("", [(2, 3, 2, 2), (2, 1, 2, 2)]),
    ("axis: 0", [(2, 3), (1, 3), (3, 3)]),
    ("axis: -1", [(2, 2, 1), (2, 2, 3)]),
])
def test_gradient(params, shapes, rng):
    layer = make_layer(concat_text(params))
    check_gradient(layer, [make_blob(rng.standard_normal(s)) for s in shapes])


def test_backward_only_where_asked(rng):
    layer, bottom, top = setup(concat_text(), [(2, 2, 3), (2, 3, 3)], rng)
    layer.forward(bottom, top)
    dy = rng.standard_normal(top[0].shape)
    top[0].diff[...] = dy
    bottom[0].diff[...] = 42.0
    layer.backward(top, [False, True], bottom)
    np.testing.assert_array_equal(to_numpy(bottom[0].diff), 42.0)
    np.testing.assert_array_equal(to_numpy(bottom[1].diff), dy[:, 2:])


def test_single_bottom_shares_storage(rng):
    layer, bottom, top = setup(concat_text(), [(2, 3)], rng)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(to_numpy(top[0].data), to_numpy(bottom[0].data))
    assert top[0].data_storage is bottom[0].data_storage
    assert top[0].diff_storage is bottom[0].diff_storage
    assert layer.flops(bottom, top) == (0.0, 0.0)         # shared: nothing is copied


def test_flops_count_the_elements_copied(rng):
    """The performance model's work for a copy: the top's elements each way, in proportion
    to the minibatch (swap/model.py fits time against it)."""
    layer, bottom, top = setup(concat_text(), [(2, 3, 2, 2), (2, 1, 2, 2)], rng)
    assert layer.flops(bottom, top) == (2 * 4 * 2 * 2.0, 2 * 4 * 2 * 2.0)
    for b, s in zip(bottom, [(6, 3, 2, 2), (6, 1, 2, 2)]):
        b.reshape(s)
    layer.reshape(bottom, top)
    assert layer.flops(bottom, top) == (6 * 4 * 2 * 2.0, 6 * 4 * 2 * 2.0)


@pytest.mark.parametrize("params,shapes,match", [
    ("", [(2, 3, 4), (2, 3, 5)],
     r"'in0' has shape \(2, 3, 4\), bottom 'in1' has shape \(2, 3, 5\)"),
    ("", [(2, 3, 4), (2, 3)], "same number of axes"),
    ("axis: 3", [(2, 3, 4), (2, 3, 4)], "axis 3 out of range"),
    ("concat_dim: 3", [(2, 3, 4), (2, 3, 4)], "concat_dim 3 out of range"),
    ("axis: 1 concat_dim: 1", [(2, 3), (2, 3)], "not both"),
])
def test_errors(params, shapes, match, rng):
    with pytest.raises(ValueError, match=match):
        setup(concat_text(params), shapes, rng)


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("params", ["", "axis: 0", "axis: -1"])
def test_gpu_matches_cpu(cp, params):
    shapes = [(4, 3, 5, 5), (4, 3, 5, 5), (4, 3, 5, 5)]
    outs = []
    for xp in (np, cp):
        r = np.random.default_rng(2)
        layer, bottom, top = setup(concat_text(params), shapes, r, xp=xp, dtype=np.float32)
        layer.forward(bottom, top)
        top[0].diff[...] = xp.asarray(r.standard_normal(top[0].shape), dtype=np.float32)
        layer.backward(top, [True] * 3, bottom)
        outs.append([to_numpy(top[0].data)] + [to_numpy(b.diff) for b in bottom])
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-5
