"""Scale and Bias: axis/num_axes broadcasting, fillers, gradients, in place, errors."""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.testing import check_gradient, make_blob, make_layer

SHAPE = (2, 3, 4, 2)


def scale_text(params="", kind="Scale"):
    field = "scale_param" if kind == "Scale" else "bias_param"
    return f'name: "s" type: "{kind}" {field} {{ {params} }}'


def setup(text, shapes, rng, in_place=False, xp=np, dtype=np.float64):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(rng.standard_normal(s), xp=xp, dtype=dtype, name=f"b{i}")
              for i, s in enumerate(shapes)]
    top = [bottom[0] if in_place else Blob(xp=xp, dtype=dtype, name="top")]
    layer.setup(bottom, top)
    return layer, bottom, top


def randomize_params(layer, rng):
    for p in layer.blobs:
        p.data[...] = layer.xp.asarray(rng.uniform(0.5, 1.5, p.shape), dtype=layer.dtype)


def run(layer, bottom, top, dy):
    """Forward and backward (all bottoms and params); returns outputs as numpy arrays."""
    layer.forward(bottom, top)
    y = to_numpy(top[0].data).copy()
    for p in layer.blobs:
        p.diff[...] = 0
    top[0].diff[...] = layer.xp.asarray(dy, dtype=layer.dtype)
    layer.backward(top, [True] * len(bottom), bottom)
    return [y] + [to_numpy(b.diff).copy() for b in bottom] + [to_numpy(p.diff).copy()
                                                             for p in layer.blobs]


# (params, bottom shapes, expected learned operand shape, broadcast shape of operand)
SCALE_CASES = [
    ("", [SHAPE], (3,), (1, 3, 1, 1)),
    ("axis: 2", [SHAPE], (4,), (1, 1, 4, 1)),
    ("axis: -2 num_axes: 2", [SHAPE], (4, 2), (1, 1, 4, 2)),
    ("axis: 1 num_axes: -1", [SHAPE], (3, 4, 2), (1, 3, 4, 2)),
    ("axis: 0 num_axes: 2", [SHAPE], (2, 3), (2, 3, 1, 1)),
    ("num_axes: 0", [SHAPE], (), ()),
]


@pytest.mark.parametrize("params,shapes,pshape,bshape", SCALE_CASES)
def test_scale_forward_learned(params, shapes, pshape, bshape, rng):
    layer, bottom, top = setup(scale_text(params + " bias_term: true"), shapes, rng)
    assert [p.shape for p in layer.blobs] == [pshape, pshape]
    # default fillers: scale 1, bias 0 (identity)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(to_numpy(top[0].data), to_numpy(bottom[0].data))
    randomize_params(layer, rng)
    layer.forward(bottom, top)
    s = to_numpy(layer.blobs[0].data).reshape(bshape)
    b = to_numpy(layer.blobs[1].data).reshape(bshape)
    np.testing.assert_allclose(to_numpy(top[0].data), to_numpy(bottom[0].data) * s + b)


@pytest.mark.parametrize("params,shapes,pshape,bshape", SCALE_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_scale_gradient_learned(params, shapes, pshape, bshape, bias, rng):
    text = scale_text(params + (" bias_term: true" if bias else ""))
    layer, bottom, top = setup(text, shapes, rng)
    randomize_params(layer, rng)
    check_gradient(layer, bottom, top, setup=False)


# (axis, shape of bottom[1]); a 0-d scale is applied with axis 0 whatever axis says
@pytest.mark.parametrize("axis,s_shape", [(0, (2, 3)), (1, (3, 4)), (1, ()), (-1, (2,)),
                                          (0, SHAPE)])
@pytest.mark.parametrize("bias", [False, True])
def test_scale_two_bottoms(axis, s_shape, bias, rng):
    text = scale_text(f"axis: {axis}" + (" bias_term: true" if bias else ""))
    layer, bottom, top = setup(text, [SHAPE, s_shape], rng)
    assert len(layer.blobs) == (1 if bias else 0)
    if bias:
        assert layer.blobs[0].shape == s_shape
    randomize_params(layer, rng)
    layer.forward(bottom, top)
    start = 0 if not s_shape else axis % len(SHAPE)
    bshape = (1,) * start + s_shape + (1,) * (len(SHAPE) - start - len(s_shape))
    expected = to_numpy(bottom[0].data) * to_numpy(bottom[1].data).reshape(bshape)
    if bias:
        expected = expected + to_numpy(layer.blobs[0].data).reshape(bshape)
    np.testing.assert_allclose(to_numpy(top[0].data), expected)
    check_gradient(layer, bottom, top, setup=False)


@pytest.mark.parametrize("params,shapes", [("", [SHAPE]), ("num_axes: -1", [SHAPE]),
                                           ("num_axes: 0", [SHAPE]), ("axis: 0", [SHAPE, (2, 3)])])
@pytest.mark.parametrize("bias", [False, True])
def test_scale_in_place_matches_out_of_place(params, shapes, bias, rng):
    text = scale_text(params + (" bias_term: true" if bias else ""))
    dy = rng.standard_normal(SHAPE)
    outs = []
    for in_place in (False, True):
        r = np.random.default_rng(7)
        layer, bottom, top = setup(text, shapes, r, in_place=in_place)
        randomize_params(layer, r)
        outs.append(run(layer, bottom, top, dy))
        reads = layer.backward_reads()
        if in_place:
            assert "bottom_copy" in reads.internals and 0 not in reads.bottom
            assert layer.internals["bottom_copy"].saved
        else:
            assert 0 in reads.bottom and not layer.internals
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, rtol=1e-13)


def test_scale_backward_reads(rng):
    layer, _, _ = setup(scale_text(), [SHAPE], rng)
    assert layer.backward_reads() == BackwardReads(bottom=(0,))
    layer.param_propagate_down = [False]  # lr_mult 0: no scale gradient, no input needed
    assert layer.backward_reads() == BackwardReads()
    layer, _, _ = setup(scale_text("axis: 0"), [SHAPE, (2, 3)], rng)
    assert layer.backward_reads() == BackwardReads(bottom=(0, 1))


def test_scale_filler_and_against_torch(rng):
    torch = pytest.importorskip("torch")
    text = scale_text('bias_term: true filler { type: "constant" value: 2.5 } '
                      'bias_filler { type: "constant" value: -1 }')
    layer, bottom, top = setup(text, [SHAPE], rng)
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].data), [2.5] * 3)
    np.testing.assert_array_equal(to_numpy(layer.blobs[1].data), [-1.0] * 3)
    randomize_params(layer, rng)
    dy = rng.standard_normal(SHAPE)
    y, dx, ds, db = run(layer, bottom, top, dy)
    tx = torch.tensor(to_numpy(bottom[0].data), requires_grad=True)
    ts = torch.tensor(to_numpy(layer.blobs[0].data), requires_grad=True)
    tb = torch.tensor(to_numpy(layer.blobs[1].data), requires_grad=True)
    ty = tx * ts[None, :, None, None] + tb[None, :, None, None]
    ty.backward(torch.tensor(dy))
    for mine, ref in ((y, ty.detach()), (dx, tx.grad), (ds, ts.grad), (db, tb.grad)):
        np.testing.assert_allclose(mine, ref.numpy(), rtol=1e-12, atol=1e-12)


def test_scale_param_diffs_accumulate(rng):
    layer, bottom, top = setup(scale_text("bias_term: true"), [SHAPE], rng)
    dy = rng.standard_normal(SHAPE)
    first = run(layer, bottom, top, dy)
    layer.backward(top, [True], bottom)  # diffs not cleared: accumulate
    np.testing.assert_allclose(to_numpy(layer.blobs[0].diff), 2 * first[2])
    np.testing.assert_allclose(to_numpy(layer.blobs[1].diff), 2 * first[3])


@pytest.mark.parametrize("params,shape,adds", [
    ("", (1, 3, 4, 2), False),                 # outer 1, 3 scales: gemv, beta 0, into the diff
    ("axis: 0 num_axes: -1", SHAPE, False),    # eltwise: the product is written to the diff
    ("axis: 2", (1, 1, 4, 1), False),          # eltwise too (outer 1, inner 1)
    ("num_axes: 0", (1, 3, 4, 2), True),       # one scale over 24 elements: a dot, added
    ("", (1, 1, 4, 2), True),                  # one channel over 8 elements: likewise
    ("", SHAPE, True),                         # outer 2: added
])
def test_scale_param_diff_accumulates_where_caffe_adds(params, shape, adds, rng):
    """Caffe's ScaleLayer::Backward_cpu writes a learned scale's diff afresh where outer_dim_
    is 1, unless one scale value spans inner_dim_ > 1 elements; the bias diff always adds.
    (Found by tests/layers/test_torch_fuzz.py's second backward.)"""
    layer, bottom, top = setup(scale_text(params + " bias_term: true"), [shape], rng)
    first = run(layer, bottom, top, rng.standard_normal(shape))
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(to_numpy(layer.blobs[0].diff), (2 if adds else 1) * first[2])
    np.testing.assert_allclose(to_numpy(layer.blobs[1].diff), 2 * first[3])


@pytest.mark.parametrize("params,shapes,match", [
    ("axis: 3 num_axes: 2", [SHAPE], "extends past"),
    ("axis: 4", [SHAPE], "out of range"),
    ("num_axes: -2", [SHAPE], "num_axes"),
    ("axis: 1", [SHAPE, (4,)], "dimension mismatch"),
    ("axis: 2", [SHAPE, (4, 2, 5)], "extends past"),
])
def test_scale_errors(params, shapes, match, rng):
    with pytest.raises(ValueError, match=match):
        setup(scale_text(params), shapes, rng)


# --------------------------------------------------------------------- Bias
BIAS_CASES = [("", [SHAPE]), ("axis: 2 num_axes: 2", [SHAPE]), ("num_axes: 0", [SHAPE]),
              ("num_axes: -1", [SHAPE]), ("axis: 0", [SHAPE, (2, 3)]), ("axis: 1", [SHAPE, ()])]


@pytest.mark.parametrize("params,shapes", BIAS_CASES)
def test_bias_gradient(params, shapes, rng):
    layer, bottom, top = setup(scale_text(params, "Bias"), shapes, rng)
    randomize_params(layer, rng)
    check_gradient(layer, bottom, top, setup=False)


def test_bias_forward_and_default_filler(rng):
    layer, bottom, top = setup(scale_text("axis: 2", "Bias"), [SHAPE], rng)
    assert layer.blobs[0].shape == (4,)
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].data), 0)
    randomize_params(layer, rng)
    layer.forward(bottom, top)
    expected = to_numpy(bottom[0].data) + to_numpy(layer.blobs[0].data).reshape(1, 1, 4, 1)
    np.testing.assert_allclose(to_numpy(top[0].data), expected)
    assert layer.backward_reads() == BackwardReads()


@pytest.mark.parametrize("params,shapes", BIAS_CASES)
def test_bias_in_place_matches_out_of_place(params, shapes, rng):
    dy = rng.standard_normal(SHAPE)
    outs = []
    for in_place in (False, True):
        r = np.random.default_rng(3)
        layer, bottom, top = setup(scale_text(params, "Bias"), shapes, r, in_place=in_place)
        randomize_params(layer, r)
        outs.append(run(layer, bottom, top, dy))
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, rtol=1e-13)


def test_bias_errors(rng):
    with pytest.raises(ValueError, match="dimension mismatch"):
        setup(scale_text("axis: 1", "Bias"), [SHAPE, (4,)], rng)


# ----------------------------------------------------------------------- GPU
def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("kind,params,shapes", [
    ("Scale", "bias_term: true", [(8, 16, 5, 5)]),
    ("Scale", "axis: 0 bias_term: true", [(8, 16, 5, 5), (8, 16)]),
    ("Scale", "num_axes: 0", [(8, 16, 5, 5)]),
    ("Bias", "", [(8, 16, 5, 5)]),
    ("Bias", "axis: 0", [(8, 16, 5, 5), (8, 16)]),
])
@pytest.mark.parametrize("in_place", [False, True])
def test_gpu_matches_cpu(cp, kind, params, shapes, in_place):
    dy = np.random.default_rng(5).standard_normal(shapes[0]).astype(np.float32)
    outs = []
    for xp in (np, cp):
        r = np.random.default_rng(4)
        layer, bottom, top = setup(scale_text(params, kind), shapes, r, in_place=in_place,
                                   xp=xp, dtype=np.float32)
        randomize_params(layer, r)
        outs.append(run(layer, bottom, top, dy))
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-5
