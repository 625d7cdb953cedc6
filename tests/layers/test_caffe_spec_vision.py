"""Vision layers against the cases of BVLC Caffe's unit tests that the per-layer tests here
do not already assert.

* ``src/caffe/test/test_convolution_layer.cpp``: TestSetup (two bottoms, then group 3),
  TestSimpleConvolution / TestSimpleConvolutionGroup (the constant-filler values 27.1 and
  c*9 + 0.1), TestSobelConvolution (a 3x3 Sobel filter against its separable 3x1 and 1x3
  halves with rectangular strides), TestDilatedConvolution (against a direct reference),
  Test0DConvolution / TestSimple3DConvolution / TestDilated3DConvolution: N-d convolution
  (Caffe's ``im2col_nd``, also under ``force_nd_im2col``) against a direct computation.
* ``src/caffe/test/test_deconvolution_layer.cpp``: TestSetup and TestSimpleDeconvolution
  (3.1, plus 3 or 9 where stride-2 windows overlap).
* ``src/caffe/test/test_im2col_layer.cpp``: TestSetup (dilation 3), TestForward and
  TestRect (the top-left column of the lowered image).
* ``src/caffe/test/test_spp_layer.cpp``: TestSetup, TestEqualOutputDims(2).
* ``src/caffe/test/test_stochastic_pooling.cpp``: TestSetup, TestStochastic,
  TestStochasticTestPhase (and StoPoolForwardTest's FLT_MIN start on an all-zero window).
* ``src/caffe/test/test_lrn_layer.cpp``: the forwards against the test's
  ReferenceLRNForward (ACROSS_CHANNELS, its large region, WITHIN_CHANNEL).
* ``src/caffe/test/test_inner_product_layer.cpp``: TestSetupTranspose{False,True},
  TestForwardTranspose, TestBackwardTranspose, TestForwardNoBatch.
* ``src/caffe/test/test_embed_layer.cpp``: TestSetup (the top gains one axis).
* ``src/caffe/test/test_maxpool_dropout_layers.cpp``: max pooling then an in-place Dropout.
* ``src/caffe/test/test_layer_factory.cpp``: TestCreateLayer (every registered type but
  Python is created from a bare LayerParameter and reports its type).
"""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.blob import Blob
from minicaffe.layer import create_layer, known_layer_types
from minicaffe.proto import caffe_pb2
from minicaffe.rng import set_random_seed
from minicaffe.testing.gradient_check import make_blob, make_layer

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


def setup(text, *xs, n_top=1, phase=None):
    layer = make_layer(text) if phase is None else make_layer(text, phase=phase)
    bottom = [make_blob(x, name=f"in{i}") for i, x in enumerate(xs)]
    top = [Blob(dtype=np.float64, name=f"out{i}") for i in range(n_top)]
    layer.setup(bottom, top)
    return layer, bottom, top


def forward(text, *xs, n_top=1, phase=None):
    layer, bottom, top = setup(text, *xs, n_top=n_top, phase=phase)
    layer.forward(bottom, top)
    return layer, bottom, top


def conv(body, name="conv", kind="Convolution"):
    return f'name: "{name}" type: "{kind}" convolution_param {{ {body} }}'


CONSTANT = ('weight_filler { type: "constant" value: 1 } '
            'bias_filler { type: "constant" value: 0.1 }')


def caffe_conv(x, w, b, stride, pad, dilation, group):
    """Direct convolution, as the test's caffe_conv reference: (N, C, H, W) -> (N, O, H', W')."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    ho = (h + 2 * pad[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    wo = (wd + 2 * pad[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    out = np.zeros((n, o, ho, wo))
    og = o // group
    for g in range(group):
        for oc in range(g * og, (g + 1) * og):
            for k in range(cg):
                for p in range(kh):
                    for q in range(kw):
                        rows = slice(p * dilation[0], p * dilation[0] + stride[0] * ho, stride[0])
                        cols = slice(q * dilation[1], q * dilation[1] + stride[1] * wo, stride[1])
                        out[:, oc] += w[oc, k, p, q] * xp[:, g * cg + k, rows, cols]
    return out + (0 if b is None else b.reshape(1, -1, 1, 1))


# ------------------------------------------------------------------ Convolution
def test_conv_setup_two_bottoms_then_group():
    rng = np.random.default_rng(0)
    x, x2 = rng.standard_normal((2, 2, 3, 6, 4))
    _, _, top = setup(conv("kernel_size: 3 stride: 2 num_output: 4"), x, x2, n_top=2)
    assert [t.shape for t in top] == [(2, 4, 2, 1)] * 2
    _, _, top = setup(conv("kernel_size: 3 stride: 2 num_output: 3 group: 3"), x, x2, n_top=2)
    assert [t.shape for t in top] == [(2, 3, 2, 1)] * 2


def test_conv_constant_fillers_sum_the_window():
    _, _, (top,) = forward(conv(f"kernel_size: 3 stride: 2 num_output: 4 {CONSTANT}"),
                           np.ones((2, 3, 6, 4)))
    np.testing.assert_allclose(top.data, 27.1, atol=1e-6)
    x = np.broadcast_to(np.arange(3.0).reshape(1, 3, 1, 1), (2, 3, 6, 4))
    _, _, (top,) = forward(conv(f"kernel_size: 3 stride: 2 num_output: 3 group: 3 {CONSTANT}"), x)
    want = np.arange(3.0).reshape(1, 3, 1, 1) * 9 + 0.1
    np.testing.assert_allclose(top.data, np.broadcast_to(want, top.shape), atol=1e-6)


def test_sobel_equals_its_separable_halves():
    x = np.random.default_rng(1).standard_normal((2, 3, 6, 4))
    full, bottom, top = setup(conv("kernel_size: 3 stride: 2 num_output: 1 bias_term: false"), x)
    full.blobs[0].data[...] = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]])  # every channel
    full.forward(bottom, top)
    col, b1, t1 = setup(conv("kernel_h: 3 kernel_w: 1 stride_h: 2 stride_w: 1 num_output: 1 "
                             "bias_term: false"), x)
    col.blobs[0].data[...] = np.array([1, 2, 1]).reshape(3, 1)
    col.forward(b1, t1)
    row, b2, t2 = setup(conv("kernel_h: 1 kernel_w: 3 stride_h: 1 stride_w: 2 num_output: 1 "
                             "bias_term: false"), t1[0].data.copy())
    row.blobs[0].data[...] = np.array([-1, 0, 1]).reshape(1, 3)
    row.forward(b2, t2)
    assert top[0].shape == t2[0].shape == (2, 1, 2, 1)
    np.testing.assert_allclose(top[0].data, t2[0].data, atol=1e-10)


def test_dilated_conv_against_direct_reference():
    x = np.random.default_rng(2).standard_normal((2, 3, 8, 7))
    layer, _, (top,) = forward(conv('kernel_size: 3 dilation: 2 num_output: 4 '
                                    'weight_filler { type: "gaussian" } '
                                    'bias_filler { type: "constant" value: 0.1 }'), x)
    assert top.shape == (2, 4, 4, 3)
    ref = caffe_conv(x, layer.blobs[0].data, layer.blobs[1].data, (1, 1), (0, 0), (2, 2), 1)
    np.testing.assert_allclose(top.data, ref, atol=1e-10)


def caffe_conv_nd(x, w, b, stride, pad, dilation, group):
    """Direct N-d convolution, as test_convolution_layer.cpp's caffe_conv does for 3-d:
    (N, C, S1..SD) -> (N, O, O1..OD)."""
    import itertools
    d = x.ndim - 2
    cg = w.shape[1]
    k = w.shape[2:]
    outs = [(x.shape[2 + i] + 2 * pad[i] - (dilation[i] * (k[i] - 1) + 1)) // stride[i] + 1
            for i in range(d)]
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple((p, p) for p in pad))
    out = np.zeros((x.shape[0], w.shape[0]) + tuple(outs))
    og = w.shape[0] // group
    for oc in range(w.shape[0]):
        g = oc // og
        for c in range(cg):
            for off in itertools.product(*(range(kk) for kk in k)):
                win = tuple(slice(o * dl, o * dl + st * n, st)
                            for o, dl, st, n in zip(off, dilation, stride, outs))
                out[:, oc] += w[(oc, c) + off] * xp[(slice(None), g * cg + c) + win]
    return out + (0 if b is None else b.reshape((1, -1) + (1,) * d))


GAUSS = 'weight_filler { type: "gaussian" } bias_filler { type: "gaussian" }'


@pytest.mark.parametrize("body, shape, geometry", [
    # as Caffe's TestSimple3DConvolution and TestDilated3DConvolution
    ("kernel_size: 3 stride: 2 num_output: 4", (2, 3, 5, 6, 4), ((2,) * 3, (0,) * 3, (1,) * 3, 1)),
    ("kernel_size: 3 dilation: 2 num_output: 4", (2, 3, 6, 7, 8),
     ((1,) * 3, (0,) * 3, (2,) * 3, 1)),
    # per-axis values, groups, padding; one spatial axis; four
    ("kernel_size: 2 kernel_size: 3 kernel_size: 1 stride: 1 stride: 2 stride: 1 pad: 1 "
     "pad: 0 pad: 1 group: 2 num_output: 4", (2, 4, 3, 5, 4), ((1, 2, 1), (1, 0, 1), (1,) * 3, 2)),
    ("kernel_size: 3 pad: 1 stride: 2 num_output: 3", (2, 2, 7), ((2,), (1,), (1,), 1)),
    ("kernel_size: 2 num_output: 2", (1, 2, 3, 3, 3, 3), ((1,) * 4, (0,) * 4, (1,) * 4, 1)),
])
def test_nd_conv_against_direct_reference(body, shape, geometry):
    """N-d convolution (Caffe's im2col_nd path) against a direct computation, with the weight
    blob (O, C/G, K1..KD), the top (N, O, O1..OD) and Caffe's truncating output size."""
    x = np.random.default_rng(2).standard_normal(shape)
    layer, _, (top,) = forward(conv(f"{body} {GAUSS}"), x)
    stride, pad, dilation, group = geometry
    assert layer.blobs[0].shape[:2] == (layer.num_output, shape[1] // group)
    ref = caffe_conv_nd(x, layer.blobs[0].data, layer.blobs[1].data, stride, pad, dilation,
                        group)
    assert top.shape == ref.shape
    np.testing.assert_allclose(top.data, ref, atol=1e-10)


@pytest.mark.parametrize("body, shape", [
    ("kernel_size: 3 stride: 2 num_output: 3", (2, 3, 5, 6, 4)),          # TestGradient3D
    ("kernel_size: 2 kernel_size: 3 kernel_size: 2 pad: 1 dilation: 2 group: 3 num_output: 3",
     (2, 3, 4, 5, 3)),
    ("kernel_size: 3 pad: 1 num_output: 2", (2, 2, 6)),
    ("kernel_size: 1 num_output: 2", (2, 3, 2, 3, 2)),                     # 1x1x1
])
@pytest.mark.parametrize("kind", ["Convolution", "Deconvolution"])
def test_nd_gradients(kind, body, shape):
    from minicaffe.testing.gradient_check import check_gradient
    layer = make_layer(conv(f"{body} {GAUSS}", kind=kind))
    check_gradient(layer, [make_blob(np.random.default_rng(3).standard_normal(shape))])


@pytest.mark.parametrize("kind", ["Convolution", "Deconvolution"])
def test_nd_against_2d(kind):
    """Caffe's TestNDAgainst2D: force_nd_im2col on a 2-d input gives the 2-d path's top, bottom
    diff and weight diff; and a 2-d input with a trailing axis of 1 and a kernel of 1 along
    it, through the N-d lowering, gives the same numbers again."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 5, 6))
    dy = None
    got = []
    for body, xs in (("", x), ("force_nd_im2col: true", x),
                     ("kernel_size: 1 pad: 0 stride: 1", x[..., None])):
        base = "kernel_size: 3 stride: 2 pad: 1 num_output: 4"
        if body.startswith("kernel_size"):      # per-axis: (3, 3, 1), (2, 2, 1), (1, 1, 0)
            base = ("kernel_size: 3 kernel_size: 3 kernel_size: 1 stride: 2 stride: 2 stride: 1 "
                    "pad: 1 pad: 1 pad: 0 num_output: 4")
            body = ""
        set_random_seed(5)
        layer, bottom, top = forward(conv(f"{base} {body} {GAUSS}", kind=kind), xs)
        if dy is None:
            dy = rng.standard_normal(top[0].shape)
        top[0].diff[...] = dy.reshape(top[0].shape)
        layer.backward(top, [True], bottom)
        got.append((top[0].data.reshape(dy.shape), bottom[0].diff.reshape(x.shape),
                    layer.blobs[0].diff.reshape(layer.blobs[0].shape[:4])))
    for other in got[1:]:
        for a, b in zip(got[0], other):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


def test_nd_deconv_matches_torch_conv_transpose3d():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(6).standard_normal((2, 4, 3, 2, 3))
    layer, _, (top,) = forward(conv(f"kernel_size: 2 kernel_size: 3 kernel_size: 2 stride: 2 "
                                    f"stride: 1 stride: 2 pad: 1 pad: 1 pad: 0 group: 2 "
                                    f"num_output: 6 {GAUSS}", kind="Deconvolution"), x)
    ref = torch.nn.functional.conv_transpose3d(
        torch.tensor(x), torch.tensor(layer.blobs[0].data), torch.tensor(layer.blobs[1].data),
        stride=(2, 1, 2), padding=(1, 1, 0), groups=2).numpy()
    assert top.shape == ref.shape and layer.blobs[0].shape == (4, 3, 2, 3, 2)
    np.testing.assert_allclose(top.data, ref, rtol=1e-10, atol=1e-12)


def test_nd_im2col_layer_is_caffes_im2col_nd():
    """Im2col on a 3-d input: top (N, C*K1*K2*K3, O1, O2, O3), row (c, k1, k2, k3) in Caffe's
    order, and col2im as its gradient."""
    from minicaffe.testing.gradient_check import check_gradient
    x = np.random.default_rng(7).standard_normal((2, 2, 4, 3, 5))
    body = "kernel_size: 2 kernel_size: 2 kernel_size: 3 stride: 2 stride: 1 stride: 1 pad: 1"
    layer, _, (top,) = forward(conv(body, kind="Im2col"), x)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (1, 1)))
    assert top.shape == (2, 2 * 2 * 2 * 3, 3, 4, 5)
    for c, i, j, k in [(0, 0, 0, 0), (1, 1, 0, 2), (1, 0, 1, 1)]:
        row = ((c * 2 + i) * 2 + j) * 3 + k
        want = xp[:, c, i:i + 2 * 3:2, j:j + 4, k:k + 5]
        np.testing.assert_allclose(top.data[:, row], want)
    check_gradient(make_layer(conv(body, kind="Im2col")), [make_blob(x)])


@pytest.mark.parametrize("kind", ["Convolution", "Deconvolution"])
def test_0d_convolution_is_a_product_over_the_last_axis(kind):
    """Caffe's Test0DConvolution: bottom (2, 3, 6, 4) with axis 3, no kernel_size: no spatial
    axis, so each of the 36 positions is a product with the (3, 4) weights plus the bias;
    top (2, 3, 6, 3).  Its gradient too."""
    from minicaffe.testing.gradient_check import check_gradient
    x = np.random.default_rng(10).standard_normal((2, 3, 6, 4))
    layer, _, (top,) = forward(conv(f"num_output: 3 axis: 3 {GAUSS}", kind=kind), x)
    w, b = layer.blobs[0].data, layer.blobs[1].data
    assert top.shape == (2, 3, 6, 3) and w.shape == ((3, 4) if kind == "Convolution" else (4, 3))
    ref = np.einsum("nijc,dc->nijd" if kind == "Convolution" else "nijc,cd->nijd", x, w) + b
    np.testing.assert_allclose(top.data, ref, atol=1e-12)
    check_gradient(make_layer(conv(f"num_output: 3 axis: 3 {GAUSS}", kind=kind)),
                   [make_blob(x)])


def test_im2col_needs_a_spatial_axis_and_2d_fields_stay_2d():
    with pytest.raises(ValueError, match="lowering needs at least 1 spatial axis") as err:
        setup(conv("kernel_size: 1", name="c0", kind="Im2col"), np.zeros((2, 3)))
    assert "'c0' (Im2col)" in str(err.value)
    with pytest.raises(ValueError, match="kernel_h & kernel_w can only be used for 2D"):
        setup(conv("num_output: 3 kernel_h: 1 kernel_w: 1"), np.zeros((2, 3, 4, 4, 4)))
    with pytest.raises(ValueError, match="kernel_h & kernel_w can only be used for 2D"):
        setup(conv("num_output: 3 kernel_h: 1 kernel_w: 1 axis: 3"), np.zeros((2, 3, 4, 4)))


def test_nd_convolution_asked_for_cudnn_runs_the_caffe_engine(monkeypatch):
    """Caffe's CuDNNConvolutionLayer takes 2 spatial axes only; here the layer says why and
    runs the CAFFE engine (even where cuDNN would run its 2-d convolutions)."""
    from minicaffe import engine as engines
    monkeypatch.setattr(engines, "resolve", lambda layer, field: engines.CUDNN)
    layer, _, (top,) = forward(conv(f"kernel_size: 2 num_output: 2 engine: CUDNN {GAUSS}"),
                               np.ones((1, 2, 3, 3, 3)))
    assert layer.engine == engines.CAFFE and "2-d only" in layer.engine_fallback
    assert top.shape == (1, 2, 2, 2, 2)


# ---------------------------------------------------------------- Deconvolution
def test_deconv_setup_two_bottoms_then_group():
    x = np.zeros((2, 3, 6, 4))
    _, _, top = setup(conv("kernel_size: 3 stride: 2 num_output: 4", kind="Deconvolution"),
                      x, x, n_top=2)
    assert [t.shape for t in top] == [(2, 4, 13, 9)] * 2
    _, _, top = setup(conv("kernel_size: 3 stride: 2 num_output: 3 group: 3",
                           kind="Deconvolution"), x, x, n_top=2)
    assert [t.shape for t in top] == [(2, 3, 13, 9)] * 2


def test_deconv_overlapping_windows_accumulate():
    _, _, top = forward(conv(f"kernel_size: 3 stride: 2 num_output: 4 {CONSTANT}",
                             kind="Deconvolution"), np.ones((2, 3, 6, 4)), np.ones((2, 3, 6, 4)),
                        n_top=2)
    h, w = np.arange(13)[:, None], np.arange(9)[None, :]
    h_overlap = (h % 2 == 0) & (h > 0) & (h < 12)
    w_overlap = (w % 2 == 0) & (w > 0) & (w < 8)
    want = 3.1 + np.where(h_overlap & w_overlap, 9, np.where(h_overlap | w_overlap, 3, 0))
    for t in top:
        np.testing.assert_allclose(t.data, np.broadcast_to(want, (2, 4, 13, 9)), atol=1e-6)


# ----------------------------------------------------------------------- Im2col
def test_im2col_setup_with_dilation():
    _, _, (top,) = setup(conv("kernel_size: 3 stride: 2 dilation: 3", kind="Im2col"),
                         np.zeros((2, 3, 10, 11)))
    assert top.shape == (2, 27, 2, 3)


@pytest.mark.parametrize("body, kh, kw", [("kernel_size: 3 stride: 2", 3, 3),
                                          ("kernel_h: 5 kernel_w: 3 stride: 2", 5, 3)])
def test_im2col_top_left_column(body, kh, kw):
    x = np.random.default_rng(3).standard_normal((2, 3, 6, 5))
    _, _, (top,) = forward(conv(body, kind="Im2col"), x)
    c = np.arange(3 * kh * kw)
    np.testing.assert_array_equal(top.data[0, :, 0, 0],
                                  x[0, c // (kh * kw), (c // kw) % kh, c % kw])


# -------------------------------------------------------------------------- SPP
@pytest.mark.parametrize("height, shape, top_shape", [
    (3, (2, 3, 9, 8), (2, 63)),         # TestSetup: 3 * (1 + 4 + 16)
    (5, (4, 3, 1024, 765), (4, 1023)),  # TestEqualOutputDims: 3 * 341
    (3, (10, 3, 7, 7), (10, 63)),       # TestEqualOutputDims2
])
def test_spp_output_is_channels_times_the_geometric_sum(height, shape, top_shape):
    layer = make_layer(f'name: "spp" type: "SPP" spp_param {{ pyramid_height: {height} }}',
                       dtype=np.float32)
    top = [Blob(dtype=np.float32)]
    layer.setup([make_blob(np.zeros(shape, np.float32), dtype=np.float32)], top)
    assert top[0].shape == top_shape


# ----------------------------------------------------------- STOCHASTIC pooling
STOCHASTIC = 'name: "pool" type: "Pooling" pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 }'


def windows(x):
    """The 3x3 stride-2 windows of a (N, C, 6, 5) bottom as (N, C, 3, 2, 9), clipped rows
    and columns filled with NaN."""
    xp = np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 0)), constant_values=np.nan)
    return np.stack([np.stack([xp[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].reshape(x.shape[:2] + (9,))
                               for j in range(2)], axis=2) for i in range(3)], axis=2)


def test_stochastic_train_draws_a_window_value_favouring_large_ones():
    x = np.random.default_rng(4).uniform(0.1, 1.0, (2, 3, 6, 5))
    _, _, (top,) = forward(STOCHASTIC, x, phase=TRAIN)
    assert top.shape == (2, 3, 3, 2)
    assert (windows(x) == top.data[..., None]).any(axis=-1).all()
    assert top.data.mean() >= 0.55   # above the data mean (0.55) by weighting large values


def test_stochastic_test_is_sum_of_squares_over_sum():
    x = np.random.default_rng(5).uniform(0.1, 1.0, (2, 3, 6, 5))
    _, _, (top,) = forward(STOCHASTIC, x, phase=TEST)
    win = windows(x)
    assert (top.data <= np.nanmax(win, axis=-1)).all()
    np.testing.assert_allclose(top.data, np.nansum(win * win, -1) / np.nansum(win, -1), rtol=1e-6)
    # StoPoolForwardTest starts its sum at FLT_MIN: an all-zero window gives 0, not NaN
    _, _, (top,) = forward(STOCHASTIC, np.zeros((1, 1, 6, 5)), phase=TEST)
    assert (top.data == 0).all()


# -------------------------------------------------------------------------- LRN
def reference_lrn(x, size, alpha, beta, region):
    """The test's ReferenceLRNForward (k = 1)."""
    n, c, h, w = x.shape
    out = np.empty_like(x)
    half = (size - 1) // 2
    for ni in range(n):
        for ci in range(c):
            for hi in range(h):
                for wi in range(w):
                    if region == "ACROSS_CHANNELS":
                        lo, hi_c = max(ci - half, 0), min(ci - half + size, c)
                        scale = 1 + (x[ni, lo:hi_c, hi, wi] ** 2).sum() * alpha / size
                    else:
                        h0, w0 = hi - half, wi - half
                        win = x[ni, ci, max(h0, 0):min(h0 + size, h), max(w0, 0):min(w0 + size, w)]
                        scale = 1 + (win ** 2).sum() * alpha / (size * size)
                    out[ni, ci, hi, wi] = x[ni, ci, hi, wi] * scale ** -beta
    return out


@pytest.mark.parametrize("body, size, region", [
    ("", 5, "ACROSS_CHANNELS"),                                  # TestForwardAcrossChannels
    ("local_size: 15", 15, "ACROSS_CHANNELS"),                   # ...LargeRegion
    ("local_size: 3 norm_region: WITHIN_CHANNEL", 3, "WITHIN_CHANNEL"),
])
def test_lrn_matches_the_tests_reference(body, size, region):
    x = np.random.default_rng(6).standard_normal((2, 7, 3, 3))
    _, _, (top,) = forward(f'name: "lrn" type: "LRN" lrn_param {{ {body} }}', x)
    assert top.shape == (2, 7, 3, 3)
    np.testing.assert_allclose(top.data, reference_lrn(x, size, 1.0, 0.75, region), rtol=1e-12)


# ---------------------------------------------------------------- InnerProduct
IP = ('name: "ip" type: "InnerProduct" inner_product_param {{ num_output: 10 {} '
      'weight_filler {{ type: "uniform" }} bias_filler {{ type: "uniform" min: 1 max: 2 }} }}')


@pytest.mark.parametrize("transpose, wshape", [("false", (10, 60)), ("true", (60, 10))])
def test_ip_setup_weight_shape_follows_transpose(transpose, wshape):
    layer, _, (top,) = setup(IP.format(f"transpose: {transpose}"), np.zeros((2, 3, 4, 5)))
    assert top.shape == (2, 10) and layer.blobs[0].shape == wshape and layer.blobs[1].shape == (10,)


def test_ip_transposed_weights_give_the_same_forward_and_backward():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 4, 5))
    a, ba, ta = forward(IP.format("transpose: false"), x)
    b, bb, tb = setup(IP.format("transpose: true"), x)
    b.blobs[0].data[...] = a.blobs[0].data.T
    b.blobs[1].data[...] = a.blobs[1].data
    b.forward(bb, tb)
    np.testing.assert_allclose(tb[0].data, ta[0].data, rtol=1e-12)
    dy = rng.standard_normal(ta[0].shape)
    for layer, bottom, top in ((a, ba, ta), (b, bb, tb)):
        top[0].diff[...] = dy
        layer.backward(top, [True], bottom)
    np.testing.assert_allclose(b.blobs[0].diff, a.blobs[0].diff.T, rtol=1e-12)
    np.testing.assert_allclose(b.blobs[1].diff, a.blobs[1].diff, rtol=1e-12)
    np.testing.assert_allclose(bb[0].diff, ba[0].diff, rtol=1e-12)


def test_ip_forward_without_a_batch():
    _, _, (top,) = forward(IP.format(""), np.random.default_rng(8).uniform(0, 1, (1, 2, 3, 4)))
    assert top.shape == (1, 10) and (top.data > 1).all()   # uniform [0, 1] weights, bias >= 1


# ------------------------------------------------------------------------ Embed
def test_embed_top_gains_one_axis():
    _, _, (top,) = setup('name: "embed" type: "Embed" embed_param { num_output: 10 '
                         'input_dim: 5 }', np.zeros((4, 1, 1, 1)))
    assert top.shape == (4, 1, 1, 1, 10)


# ------------------------------------------------------------ MAX pool, Dropout
def test_max_pool_then_in_place_dropout():
    set_random_seed(1701)
    pool, bottom, top = forward('name: "pool" type: "Pooling" pooling_param { pool: MAX '
                                'kernel_size: 3 stride: 2 }', np.ones((2, 3, 6, 5)), phase=TRAIN)
    assert top[0].shape == (2, 3, 3, 2)
    assert top[0].data.sum() == top[0].count
    drop = make_layer('name: "drop" type: "Dropout" dropout_param { dropout_ratio: 0.5 }',
                      phase=TRAIN)
    drop.setup(top, top)
    drop.forward(top, top)
    assert top[0].shape == (2, 3, 3, 2)
    kept = top[0].data != 0
    assert set(np.unique(top[0].data)) <= {0.0, 2.0} and 0 < kept.sum() < top[0].count
    top[0].diff[...] = 1
    drop.backward(top, [True], top)
    pool.backward(top, [True], bottom)
    # each kept output sends 1 / (1 - 0.5) to the first maximum of its window
    assert bottom[0].diff.sum() == 2 * kept.sum()


# ---------------------------------------------------------------- LayerFactory
def test_every_registered_type_but_python_is_created_from_a_bare_param():
    types = known_layer_types()
    assert {"Convolution", "Pooling", "LRN", "InnerProduct", "Data", "MemoryData",
            "HDF5Data", "DummyData", "ImageData", "SPP", "Embed", "Im2col",
            "Deconvolution"} <= set(types)
    for t in types:
        if t == "Python":   # as in Caffe: checked by the Python-layer tests
            continue
        layer = create_layer(caffe_pb2.LayerParameter(name="l", type=t))
        assert layer.type == t


@pytest.mark.gpu
@pytest.mark.parametrize("kind, body", [
    ("Convolution", "kernel_size: 3 stride: 2 pad: 1 num_output: 4"),
    ("Convolution", "kernel_size: 2 kernel_size: 3 kernel_size: 1 dilation: 2 group: 2 "
                    "num_output: 4"),
    ("Deconvolution", "kernel_size: 2 stride: 2 num_output: 3"),
    ("Im2col", "kernel_size: 2 pad: 1"),
])
def test_gpu_nd_matches_cpu(cp, kind, body):
    """The N-d lowering on CuPy (no CUDA fast path: the generic strided views) against NumPy:
    top, bottom diff and weight diff of a 3-d layer, float32."""
    from minicaffe.backend import to_numpy
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 4, 5, 6, 4)).astype(np.float32)
    got = []
    for xp in (np, cp):
        set_random_seed(9)
        layer = make_layer(conv(f"{body} {GAUSS if kind != 'Im2col' else ''}", kind=kind),
                           xp=xp, dtype=np.float32)
        bottom = [make_blob(x, xp=xp, dtype=np.float32, name="in")]
        top = [Blob(xp=xp, dtype=np.float32, name="out")]
        layer.setup(bottom, top)
        layer.forward(bottom, top)
        top[0].diff[...] = xp.asarray(np.linspace(-1, 1, top[0].count, dtype=np.float32)
                                      .reshape(top[0].shape))
        for p in layer.blobs:
            p.diff[...] = 0
        layer.backward(top, [True], bottom)
        got.append([to_numpy(top[0].data), to_numpy(bottom[0].diff)]
                   + [to_numpy(p.diff) for p in layer.blobs])
    for a, b in zip(*got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)


def test_a_3d_net_trains_and_its_swap_plan_is_bit_identical():
    """A net of 3-d convolutions (DummyData (N, C, D, H, W), Convolution, ReLU, Convolution,
    InnerProduct, SoftmaxWithLoss) trains, and under the naive swap plan, every region
    poisoned with NaN, gives the plain run's parameters and losses bit for bit."""
    from minicaffe.proto import parse_text
    from minicaffe.testing import sgd_solver, train_steps
    text = """
name: "c3d_like"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 2 dim: 5 dim: 6 dim: 6 } shape { dim: 4 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "uniform" min: 0 max: 2.99 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
  convolution_param { num_output: 4 kernel_size: 2 stride: 2 weight_filler { type: "xavier" } } }
layer { name: "fc" type: "InnerProduct" bottom: "conv2" top: "fc"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""
    runs = []
    for strategy in (None, "naive"):
        set_random_seed(11)
        solver = sgd_solver(parse_text(text, caffe_pb2.NetParameter))
        runs.append(train_steps(solver, 8, strategy, None, "chunked"))
        assert solver.net.blobs["conv2"].shape == (4, 4, 2, 3, 3)
    (p0, h0, l0, _), (p1, h1, l1, ex) = runs
    assert all(np.array_equal(a, b) for a, b in zip(p0, p1)) and l0 == l1
    assert ex.plan.offloaded and np.isfinite(l0).all()
