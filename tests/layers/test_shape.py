"""Flatten, Reshape, Split, Silence: shape inference, storage sharing, gradients, errors."""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.testing import check_gradient, make_blob, make_layer

SHAPE = (2, 3, 6, 5)


def setup(text, shape=SHAPE, n_top=1, rng=None, xp=np, dtype=np.float64):
    rng = rng or np.random.default_rng(0)
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(rng.standard_normal(shape), xp=xp, dtype=dtype, name="in")]
    top = [Blob(xp=xp, dtype=dtype, name=f"out{i}") for i in range(n_top)]
    layer.setup(bottom, top)
    return layer, bottom, top


def reshape_text(dims, extra=""):
    d = " ".join(f"dim: {x}" for x in dims)
    return f'name: "r" type: "Reshape" reshape_param {{ shape {{ {d} }} {extra} }}'


def flatten_text(params=""):
    return f'name: "f" type: "Flatten" flatten_param {{ {params} }}'


# ------------------------------------------------------------------ Flatten
@pytest.mark.parametrize("params,expected", [
    ("", (2, 90)),
    ("axis: 2", (2, 3, 30)),
    ("axis: 0 end_axis: 1", (6, 6, 5)),
    ("axis: 1 end_axis: -2", (2, 18, 5)),
    ("axis: -1", (2, 3, 6, 5)),
    ("axis: 0", (180,)),
    # end_axis one before axis: Caffe's count(axis, end_axis + 1) is the empty product 1, so
    # Flatten inserts an axis of extent 1 there (flatten_layer.cpp; Blob::count allows it)
    ("axis: 2 end_axis: 1", (2, 3, 1, 6, 5)),
    ("axis: 1 end_axis: 0", (2, 1, 3, 6, 5)),
])
def test_flatten_shapes(params, expected):
    layer, bottom, top = setup(flatten_text(params))
    assert top[0].shape == expected
    layer.forward(bottom, top)
    np.testing.assert_array_equal(to_numpy(top[0].data),
                                  to_numpy(bottom[0].data).reshape(expected))


def test_flatten_shares_data_and_diff():
    layer, bottom, top = setup(flatten_text())
    assert top[0].data_storage is bottom[0].data_storage
    assert top[0].diff_storage is bottom[0].diff_storage
    top[0].diff[...] = 3.0
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(to_numpy(bottom[0].diff), 3.0)
    assert layer.backward_reads() == BackwardReads()
    assert layer.flops(bottom, top) == (0.0, 0.0)


def test_flatten_gradient(rng):
    check_gradient(make_layer(flatten_text()), [make_blob(rng.standard_normal((2, 3, 2)))])


def test_flatten_errors():
    with pytest.raises(ValueError, match="in-place"):
        layer = make_layer(flatten_text())
        b = make_blob(np.zeros(SHAPE))
        layer.setup([b], [b])
    with pytest.raises(ValueError, match="end_axis 7 out of range"):
        setup(flatten_text("end_axis: 7"))
    with pytest.raises(ValueError, match="comes before"):
        setup(flatten_text("axis: 3 end_axis: 1"))


# ------------------------------------------------------------------ Reshape
@pytest.mark.parametrize("dims,extra,expected", [
    ([6, 2, 3, 5], "", (6, 2, 3, 5)),
    ([0, -1], "", (2, 90)),
    ([0, 0, -1], "", (2, 3, 30)),
    ([-1, 0, 0, 0], "", (2, 3, 6, 5)),
    ([0, 3, 2, -1], "", (2, 3, 2, 15)),
    ([1, 1, 1], "axis: 0 num_axes: 0", (1, 1, 1, 2, 3, 6, 5)),
    ([1, 1, 1], "axis: 2 num_axes: 0", (2, 3, 1, 1, 1, 6, 5)),
    ([1, 1, 1], "axis: -1 num_axes: 0", (2, 3, 6, 5, 1, 1, 1)),
    ([-1], "axis: 1 num_axes: 2", (2, 18, 5)),
    ([-1], "axis: -4 num_axes: 2", (2, 18, 5)),  # negative axis: ndim + axis + 1
    ([-1], "axis: -3 num_axes: 2", (2, 3, 30)),
    ([0, -1], "axis: 1", (2, 3, 30)),
    ([3, 2], "axis: -3 num_axes: 1", (2, 3, 3, 2, 5)),
    ([], "axis: 0", ()),
])
def test_reshape_shapes(dims, extra, expected):
    shape = (1,) if expected == () else SHAPE
    layer, bottom, top = setup(reshape_text(dims, extra), shape=shape)
    assert top[0].shape == expected
    layer.forward(bottom, top)
    np.testing.assert_array_equal(to_numpy(top[0].data).ravel(),
                                  to_numpy(bottom[0].data).ravel())
    assert top[0].data_storage is bottom[0].data_storage
    assert top[0].diff_storage is bottom[0].diff_storage


def test_reshape_follows_new_batch_size():
    layer, bottom, top = setup(reshape_text([0, -1]))
    bottom[0].reshape(7, 3, 6, 5)
    layer.reshape(bottom, top)
    assert top[0].shape == (7, 90)


def test_reshape_gradient(rng):
    check_gradient(make_layer(reshape_text([-1, 2])), [make_blob(rng.standard_normal((3, 2, 2)))])


@pytest.mark.parametrize("dims,extra,match", [
    ([-1, -1], "", "multiple -1"),
    ([0, 0, 0, 0, 0], "", "no corresponding axis"),
    ([7, -1], "", r"divisible by the product of the specified dimensions \(7\)"),
    ([2, 3, 6, 4], "", "output count 144"),
    ([-2, 3], "", "invalid dimension -2"),
    ([1], "axis: 5", "axis 5 out of range"),
    ([1], "axis: -6", "axis -6 out of range"),
    ([1], "num_axes: -2", "num_axes must be >= 0"),
    ([1], "axis: 3 num_axes: 2", "out of range"),
])
def test_reshape_errors(dims, extra, match):
    with pytest.raises(ValueError, match=match):
        setup(reshape_text(dims, extra))


# -------------------------------------------------------------------- Split
def test_split_shares_data_sums_diffs(rng):
    layer, bottom, top = setup('name: "s" type: "Split"', n_top=3)
    for t in top:
        assert t.shape == SHAPE
        assert t.data_storage is bottom[0].data_storage
        assert t.diff_storage is not bottom[0].diff_storage
    layer.forward(bottom, top)
    np.testing.assert_array_equal(to_numpy(top[2].data), to_numpy(bottom[0].data))
    diffs = [rng.standard_normal(SHAPE) for _ in top]
    for t, d in zip(top, diffs):
        t.diff[...] = d
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(to_numpy(bottom[0].diff), sum(diffs))
    assert layer.backward_reads() == BackwardReads()
    assert layer.flops(bottom, top) == (0.0, 2.0 * np.prod(SHAPE))


@pytest.mark.parametrize("n_top", [1, 2, 4])
def test_split_gradient(n_top, rng):
    layer = make_layer('name: "s" type: "Split"')
    tops = [Blob(dtype=np.float64, name=f"t{i}") for i in range(n_top)]
    check_gradient(layer, [make_blob(rng.standard_normal((2, 3)))], tops)


def test_split_refuses_in_place():
    layer = make_layer('name: "s" type: "Split"')
    b = make_blob(np.zeros(3))
    with pytest.raises(ValueError, match="in-place"):
        layer.setup([b], [Blob(), b])


# ------------------------------------------------------------------ Silence
def test_silence_zeroes_diffs(rng):
    layer = make_layer('name: "s" type: "Silence"')
    bottom = [make_blob(rng.standard_normal(s)) for s in ((2, 3), (4,))]
    layer.setup(bottom, [])
    assert layer.forward(bottom, []) == 0.0
    for b in bottom:
        b.diff[...] = 5.0
    layer.backward([], [True, False], bottom)
    np.testing.assert_array_equal(to_numpy(bottom[0].diff), 0.0)
    np.testing.assert_array_equal(to_numpy(bottom[1].diff), 5.0)
    assert layer.backward_reads() == BackwardReads()
    check_gradient(layer, bottom, [], setup=False)


def test_silence_takes_no_tops():
    layer = make_layer('name: "s" type: "Silence"')
    with pytest.raises(ValueError, match="exactly 0 top"):
        layer.setup([make_blob(np.zeros(2))], [Blob()])


# ----------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_matches_cpu(cp):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    diffs = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3)]
    outs = []
    for xp in (np, cp):
        res = []
        for text in (flatten_text("axis: 1 end_axis: 2"), reshape_text([0, -1, 5])):
            layer, bottom, top = setup(text, xp=xp, dtype=np.float32)
            bottom[0].data[...] = xp.asarray(x)
            layer.forward(bottom, top)
            top[0].diff[...] = xp.asarray(diffs[0].reshape(top[0].shape))
            layer.backward(top, [True], bottom)
            res += [to_numpy(top[0].data), to_numpy(bottom[0].diff)]
        layer, bottom, top = setup('name: "s" type: "Split"', n_top=3, xp=xp, dtype=np.float32)
        bottom[0].data[...] = xp.asarray(x)
        layer.forward(bottom, top)
        for t, d in zip(top, diffs):
            t.diff[...] = xp.asarray(d)
        layer.backward(top, [True], bottom)
        res += [to_numpy(t.data) for t in top] + [to_numpy(bottom[0].diff)]
        outs.append(res)
    for c, g in zip(*outs):
        np.testing.assert_allclose(g, c, rtol=1e-6, atol=1e-6)
