"""Vision layers against direct NumPy transcriptions of BVLC Caffe's CPU loops
(src/caffe/layers/pooling_layer.cpp, lrn_layer.cpp), float64, forward and
backward, under the less common parameters: padding with ceil rounding and the
clipped last window, AVE's divisor, MAX ties and the mask top, FLOOR rounding,
LRN ACROSS_CHANNELS / WITHIN_CHANNEL (k ignored by the latter)."""
import math

import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.blob import Blob
from minicaffe.testing.gradient_check import make_blob, make_layer

FLT_MAX = float(np.finfo(np.float32).max)


# ---------------------------------------------------------------- Caffe loops
def caffe_pool_shape(h, w, kh, kw, sh, sw, ph_, pw_, ceil=True):
    rnd = math.ceil if ceil else math.floor
    ph = int(rnd((h + 2 * ph_ - kh) / sh)) + 1
    pw = int(rnd((w + 2 * pw_ - kw) / sw)) + 1
    if ph_ or pw_:
        if (ph - 1) * sh >= h + ph_:
            ph -= 1
        if (pw - 1) * sw >= w + pw_:
            pw -= 1
    return ph, pw


def caffe_pool_forward(x, method, kh, kw, sh, sw, pad_h, pad_w, ceil=True):
    n, c, h, w = x.shape
    PH, PW = caffe_pool_shape(h, w, kh, kw, sh, sw, pad_h, pad_w, ceil)
    top = np.zeros((n, c, PH, PW))
    mask = np.full((n, c, PH, PW), -1, dtype=np.int64)
    size = np.zeros((PH, PW))
    for i in range(n):
        for ch in range(c):
            for ph in range(PH):
                for pw in range(PW):
                    hstart = ph * sh - pad_h
                    wstart = pw * sw - pad_w
                    if method == "MAX":
                        hend = min(hstart + kh, h)
                        wend = min(wstart + kw, w)
                        hstart = max(hstart, 0)
                        wstart = max(wstart, 0)
                        t = -FLT_MAX
                        for hh in range(hstart, hend):
                            for ww in range(wstart, wend):
                                if x[i, ch, hh, ww] > t:
                                    t = x[i, ch, hh, ww]
                                    mask[i, ch, ph, pw] = hh * w + ww
                        top[i, ch, ph, pw] = t
                    else:
                        hend = min(hstart + kh, h + pad_h)
                        wend = min(wstart + kw, w + pad_w)
                        pool_size = (hend - hstart) * (wend - wstart)
                        size[ph, pw] = pool_size
                        hstart = max(hstart, 0)
                        wstart = max(wstart, 0)
                        hend = min(hend, h)
                        wend = min(wend, w)
                        s = 0.0
                        for hh in range(hstart, hend):
                            for ww in range(wstart, wend):
                                s += x[i, ch, hh, ww]
                        top[i, ch, ph, pw] = s / pool_size
    return top, mask, size


def caffe_pool_backward(x_shape, top_diff, method, mask, kh, kw, sh, sw, pad_h, pad_w, size):
    n, c, h, w = x_shape
    bd = np.zeros(x_shape)
    PH, PW = top_diff.shape[2:]
    for i in range(n):
        for ch in range(c):
            for ph in range(PH):
                for pw in range(PW):
                    if method == "MAX":
                        m = mask[i, ch, ph, pw]
                        if m >= 0:  # Caffe indexes unconditionally; -1 never occurs with pad < kernel
                            bd[i, ch, m // w, m % w] += top_diff[i, ch, ph, pw]
                    else:
                        hstart = ph * sh - pad_h
                        wstart = pw * sw - pad_w
                        hend = min(hstart + kh, h + pad_h)
                        wend = min(wstart + kw, w + pad_w)
                        pool_size = (hend - hstart) * (wend - wstart)
                        hstart, wstart = max(hstart, 0), max(wstart, 0)
                        hend, wend = min(hend, h), min(wend, w)
                        bd[i, ch, hstart:hend, wstart:wend] += top_diff[i, ch, ph, pw] / pool_size
    return bd


def run_layer(text, x, n_top=1, phase=None):
    layer = make_layer(text, phase=phase)
    bottom = [make_blob(x, name="in")]
    top = [Blob(dtype=np.float64, name=f"t{i}") for i in range(n_top)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return layer, bottom, top


def backward(layer, bottom, top, top_diff):
    top[0].diff[...] = top_diff
    bottom[0].diff[...] = 0
    layer.backward(top, [True], bottom)
    return np.array(bottom[0].diff)


# (prototxt geometry, (kh, kw, sh, sw, pad_h, pad_w), ceil, input shape)
POOL_CASES = {
    "k3s2p1_ceil": ("kernel_size: 3 stride: 2 pad: 1", (3, 3, 2, 2, 1, 1), True, (2, 2, 6, 7)),
    "k2s2p1_clip": ("kernel_size: 2 stride: 2 pad: 1", (2, 2, 2, 2, 1, 1), True, (1, 2, 4, 5)),
    "k3s3p2_clip": ("kernel_size: 3 stride: 3 pad: 2", (3, 3, 3, 3, 2, 2), True, (1, 2, 5, 7)),
    "rect_pad_h_only": ("kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 3 pad_h: 1 pad_w: 0",
                        (3, 2, 2, 3, 1, 0), True, (2, 1, 7, 8)),
    "rect_pad_w_only": ("kernel_h: 2 kernel_w: 4 stride_h: 3 stride_w: 2 pad_h: 0 pad_w: 3",
                        (2, 4, 3, 2, 0, 3), True, (1, 2, 8, 6)),
    "k4s3p3": ("kernel_size: 4 stride: 3 pad: 3", (4, 4, 3, 3, 3, 3), True, (1, 1, 6, 5)),
    "floor_k3s2p1": ("kernel_size: 3 stride: 2 pad: 1 round_mode: FLOOR", (3, 3, 2, 2, 1, 1),
                     False, (2, 2, 6, 7)),
    "floor_k2s3": ("kernel_size: 2 stride: 3 round_mode: FLOOR", (2, 2, 3, 3, 0, 0), False,
                   (1, 2, 7, 8)),
    # pad on h only: Caffe's clip test runs on both axes, and drops w's window starting at 6
    "clip_w_without_pad_w": ("kernel_h: 3 kernel_w: 1 stride_h: 2 stride_w: 3 pad_h: 1 pad_w: 0",
                             (3, 1, 2, 3, 1, 0), True, (1, 2, 5, 5)),
    "global": ("global_pooling: true", (5, 6, 1, 1, 0, 0), True, (2, 3, 5, 6)),
}


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pooling_matches_caffe_loops(case, method):
    body, geom, ceil, shape = POOL_CASES[case]
    rng = np.random.default_rng(7)
    # few distinct values: ties inside windows, so the first-max rule is exercised
    x = rng.integers(-3, 4, size=shape).astype(np.float64)
    n_top = 2 if method == "MAX" else 1
    layer, bottom, top = run_layer(
        f'name: "p" type: "Pooling" pooling_param {{ pool: {method} {body} }}', x, n_top)
    exp, mask, size = caffe_pool_forward(x, method, *geom, ceil=ceil)
    assert top[0].shape == exp.shape
    np.testing.assert_allclose(top[0].data, exp, rtol=1e-12, atol=1e-12)
    if method == "MAX":
        np.testing.assert_array_equal(np.asarray(top[1].data), mask)
    td = rng.standard_normal(exp.shape)
    got = backward(layer, bottom, top, td)
    np.testing.assert_allclose(got, caffe_pool_backward(x.shape, td, method, mask, *geom, size),
                               rtol=1e-12, atol=1e-12)


def test_pooling_max_internal_mask_same_as_top_mask():
    body, geom, ceil, shape = POOL_CASES["k3s2p1_ceil"]
    x = np.random.default_rng(3).integers(-2, 3, size=shape).astype(np.float64)
    layer, bottom, top = run_layer(
        f'name: "p" type: "Pooling" pooling_param {{ pool: MAX {body} }}', x, 1)
    exp, mask, _ = caffe_pool_forward(x, "MAX", *geom, ceil=ceil)
    td = np.random.default_rng(4).standard_normal(exp.shape)
    np.testing.assert_allclose(backward(layer, bottom, top, td),
                               caffe_pool_backward(x.shape, td, "MAX", mask, *geom, None))


def test_stochastic_test_phase_weighted_average():
    # Caffe's StoPoolForwardTest: cumsum(x^2) / cumsum(x), starting from FLT_MIN
    x = np.random.default_rng(5).uniform(0.1, 1.0, size=(2, 2, 5, 6))
    layer, bottom, top = run_layer('name: "p" type: "Pooling" pooling_param { pool: STOCHASTIC '
                                   'kernel_size: 3 stride: 2 }', x, phase=1)
    ph, pw = caffe_pool_shape(5, 6, 3, 3, 2, 2, 0, 0)
    exp = np.zeros((2, 2, ph, pw))
    flt_min = float(np.finfo(np.float32).tiny)
    for i in range(ph):
        for j in range(pw):
            win = x[:, :, i * 2:min(i * 2 + 3, 5), j * 2:min(j * 2 + 3, 6)]
            exp[:, :, i, j] = (win ** 2).sum((2, 3)) / (flt_min + win.sum((2, 3)))
    np.testing.assert_allclose(top[0].data, exp, rtol=1e-12)


def test_stochastic_train_phase_samples_in_window():
    x = np.random.default_rng(6).uniform(0.1, 1.0, size=(2, 2, 5, 6))
    x[0, 0, :2, :] = 0.0  # rows no sample may come from in the first window row
    layer, bottom, top = run_layer('name: "p" type: "Pooling" pooling_param { pool: STOCHASTIC '
                                   'kernel_size: 3 stride: 2 }', x, phase=0)
    assert top[0].shape == (2, 2, 2, 3)
    for n in range(2):
        for c in range(2):
            for i in range(2):
                for j in range(3):
                    win = x[n, c, i * 2:min(i * 2 + 3, 5), j * 2:min(j * 2 + 3, 6)]
                    v = top[0].data[n, c, i, j]
                    assert np.any(win == v) and v > 0
    td = np.random.default_rng(1).standard_normal(top[0].shape)
    bd = backward(layer, bottom, top, td)
    assert np.isclose(bd.sum(), td.sum())  # each diff goes to exactly one sampled position
    assert np.all(bd[0, 0, :2, :] == 0)


# ------------------------------------------------------------------------ LRN
def caffe_lrn_across(x, size, alpha, beta, k, td):
    n, c, h, w = x.shape
    pre_pad = (size - 1) // 2
    padded = np.zeros((n, c + size - 1, h, w))
    padded[:, pre_pad:pre_pad + c] = x * x
    scale = np.empty_like(x)
    for ch in range(c):
        scale[:, ch] = k + alpha / size * padded[:, ch:ch + size].sum(1)
    top = x * scale ** -beta
    # CrossChannelBackward_cpu
    inverse_pre_pad = size - (size + 1) // 2
    ratio = np.zeros((n, c + size - 1, h, w))
    ratio[:, inverse_pre_pad:inverse_pre_pad + c] = td * top / scale
    cache_ratio = 2.0 * alpha * beta / size
    bd = np.empty_like(x)
    for ch in range(c):
        accum = ratio[:, ch:ch + size].sum(1)
        bd[:, ch] = td[:, ch] * scale[:, ch] ** -beta - cache_ratio * x[:, ch] * accum
    return top, bd


def caffe_lrn_within(x, size, alpha, beta):
    """split -> square -> AVE pool (pad (size-1)/2, stride 1) -> power(shift 1,
    scale alpha, power -beta) -> product; k is not used."""
    alpha, beta = float(np.float32(alpha)), float(np.float32(beta))  # float proto fields
    pad = (size - 1) // 2
    sq = x * x
    pooled, _, _ = caffe_pool_forward(sq, "AVE", size, size, 1, 1, pad, pad)
    return x * (1.0 + alpha * pooled) ** -beta


@pytest.mark.parametrize("size,k", [(3, 1.0), (5, 2.0), (1, 0.5), (7, 1.5)])
def test_lrn_across_channels_matches_caffe_loops(size, k):
    rng = np.random.default_rng(size)
    x = rng.standard_normal((2, 6, 3, 2))
    layer, bottom, top = run_layer(f'name: "l" type: "LRN" lrn_param {{ local_size: {size} '
                                   f'alpha: 0.7 beta: 0.6 k: {k} }}', x)
    td = rng.standard_normal(x.shape)
    f = lambda v: float(np.float32(v))  # noqa: E731  (LRNParameter's fields are float)
    exp, exp_bd = caffe_lrn_across(x, size, f(0.7), f(0.6), f(k), td)
    np.testing.assert_allclose(top[0].data, exp, rtol=1e-12)
    np.testing.assert_allclose(backward(layer, bottom, top, td), exp_bd, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("size", [3, 5])
def test_lrn_within_channel_matches_caffe_composition(size):
    rng = np.random.default_rng(10 + size)
    x = rng.standard_normal((2, 2, 5, 4))
    layer, bottom, top = run_layer(
        f'name: "l" type: "LRN" lrn_param {{ local_size: {size} alpha: 0.9 beta: 0.7 k: 3.0 '
        'norm_region: WITHIN_CHANNEL }', x)
    np.testing.assert_allclose(top[0].data, caffe_lrn_within(x, size, 0.9, 0.7), rtol=1e-12)
    # backward against the numerical derivative of the composition
    td = rng.standard_normal(top[0].shape)
    got = backward(layer, bottom, top, td)
    eps = 1e-6
    num = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp_, xm = x.copy(), x.copy()
        xp_[idx] += eps
        xm[idx] -= eps
        num[idx] = ((caffe_lrn_within(xp_, size, 0.9, 0.7)
                     - caffe_lrn_within(xm, size, 0.9, 0.7)) * td).sum() / (2 * eps)
    np.testing.assert_allclose(got, num, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_lrn_even_local_size_refused(region):
    # lrn_layer.cpp LayerSetUp: CHECK_EQ(size_ % 2, 1) << "LRN only supports odd values..."
    with pytest.raises(ValueError, match="odd"):
        run_layer(f'name: "l" type: "LRN" lrn_param {{ local_size: 4 norm_region: {region} }}',
                  np.ones((1, 6, 3, 3)))


# ------------------------------------------------------------------------ SPP
def caffe_spp_forward(x, height, method):
    """spp_layer.cpp: levels l = 0..L-1 of GetPoolingParam, flattened and concatenated."""
    n, c, h, w = x.shape
    outs, geoms = [], []
    for level in range(height):
        bins = 2 ** level
        kh, kw = math.ceil(h / bins), math.ceil(w / bins)
        ph, pw = (kh * bins - h + 1) // 2, (kw * bins - w + 1) // 2
        geom = (kh, kw, kh, kw, ph, pw)
        top, mask, size = caffe_pool_forward(x, method, *geom)
        outs.append(top)
        geoms.append((geom, mask, size, top.shape))
    if height == 1:
        return outs[0], geoms
    return np.concatenate([o.reshape(n, -1) for o in outs], axis=1), geoms


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("height,shape", [(1, (2, 3, 5, 4)), (2, (2, 2, 5, 7)),
                                          (3, (1, 2, 9, 10))])
def test_spp_matches_caffe_loops(height, shape, method):
    rng = np.random.default_rng(height)
    x = rng.integers(-3, 4, size=shape).astype(np.float64)
    layer, bottom, top = run_layer(f'name: "s" type: "SPP" spp_param {{ pyramid_height: {height} '
                                   f'pool: {method} }}', x)
    exp, geoms = caffe_spp_forward(x, height, method)
    assert top[0].shape == exp.shape
    np.testing.assert_allclose(top[0].data, exp, rtol=1e-12, atol=1e-12)
    td = rng.standard_normal(exp.shape)
    got = backward(layer, bottom, top, td)
    exp_bd = np.zeros(shape)
    off = 0
    for geom, mask, size, tshape in geoms:
        cnt = int(np.prod(tshape[1:]))
        tdl = td.reshape(shape[0], -1)[:, off:off + cnt].reshape(tshape)
        off += cnt
        exp_bd += caffe_pool_backward(shape, tdl, method, mask, *geom, size)
    np.testing.assert_allclose(got, exp_bd, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- Convolution
def caffe_conv_forward(x, W, b, stride, pad, dil, group):
    """conv_layer.cpp via im2col (im2col.cpp) + per-group gemm, 2 spatial axes."""
    n, c, h, w = x.shape
    o, cg, kh, kw = W.shape
    oh = (h + 2 * pad[0] - (dil[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (w + 2 * pad[1] - (dil[1] * (kw - 1) + 1)) // stride[1] + 1
    og = o // group
    top = np.zeros((n, o, oh, ow))
    for i in range(n):
        for g in range(group):
            col = np.zeros((cg * kh * kw, oh * ow))
            r = 0
            for ch in range(cg):
                for ki in range(kh):
                    for kj in range(kw):
                        for y in range(oh):
                            for z in range(ow):
                                hh = -pad[0] + ki * dil[0] + y * stride[0]
                                ww = -pad[1] + kj * dil[1] + z * stride[1]
                                if 0 <= hh < h and 0 <= ww < w:
                                    col[r, y * ow + z] = x[i, g * cg + ch, hh, ww]
                        r += 1
            wg = W[g * og:(g + 1) * og].reshape(og, -1)
            top[i, g * og:(g + 1) * og] = (wg @ col).reshape(og, oh, ow)
        if b is not None:
            top[i] += b[:, None, None]
    return top


def numeric_vjp(f, x, td, eps=1e-6):
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        a, m = x.copy(), x.copy()
        a[idx] += eps
        m[idx] -= eps
        g[idx] = ((f(a) - f(m)) * td).sum() / (2 * eps)
    return g


CONV_CASES = {
    "dil_pad_group_bias": ("num_output: 4 kernel_size: 3 dilation: 2 pad: 2 group: 2",
                           (1, 1), (2, 2), (2, 2), 2, True, (2, 4, 5, 6)),
    "rect_hw": ("num_output: 3 kernel_h: 2 kernel_w: 3 stride_h: 2 stride_w: 1 pad_h: 1 "
                "pad_w: 2 bias_term: false", (2, 1), (1, 2), (1, 1), 1, False, (1, 2, 5, 4)),
    "force_nd_dil_group": ("num_output: 6 kernel_size: 2 kernel_size: 3 stride: 2 stride: 1 "
                           "pad: 1 pad: 0 dilation: 1 dilation: 2 group: 3 force_nd_im2col: true",
                           (2, 1), (1, 0), (1, 2), 3, True, (2, 3, 5, 7)),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_convolution_matches_caffe_im2col(case):
    body, stride, pad, dil, group, bias, shape = CONV_CASES[case]
    rng = np.random.default_rng(11)
    x = rng.standard_normal(shape)
    layer, bottom, top = run_layer(
        f'name: "c" type: "Convolution" convolution_param {{ {body} '
        'weight_filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" std: 1 } }', x)
    W = np.array(layer.blobs[0].data)
    b = np.array(layer.blobs[1].data) if bias else None
    assert len(layer.blobs) == (2 if bias else 1)
    exp = caffe_conv_forward(x, W, b, stride, pad, dil, group)
    np.testing.assert_allclose(top[0].data, exp, rtol=1e-10, atol=1e-12)
    td = rng.standard_normal(exp.shape)
    for blob in layer.blobs:
        blob.diff[...] = 0
    got = backward(layer, bottom, top, td)
    # the maps are linear: central differences are exact up to rounding
    np.testing.assert_allclose(
        got, numeric_vjp(lambda v: caffe_conv_forward(v, W, b, stride, pad, dil, group), x, td),
        rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(
        layer.blobs[0].diff,
        numeric_vjp(lambda v: caffe_conv_forward(x, v, b, stride, pad, dil, group), W, td),
        rtol=1e-6, atol=1e-8)
    if bias:
        np.testing.assert_allclose(layer.blobs[1].diff, td.sum((0, 2, 3)), rtol=1e-12)


def test_convolution_axis_treats_leading_axes_as_batch():
    # conv_layer / base_conv_layer: channel_axis_ = axis; num_ = product of axes before it
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 3, 2, 4, 5))  # axis 2: channels 2, spatial 4 x 5
    layer, bottom, top = run_layer(
        'name: "c" type: "Convolution" convolution_param { num_output: 3 kernel_size: 2 axis: 2 '
        'pad: 1 stride: 2 weight_filler { type: "gaussian" std: 1 } '
        'bias_filler { type: "gaussian" std: 1 } }', x)
    W, b = np.array(layer.blobs[0].data), np.array(layer.blobs[1].data)
    exp = caffe_conv_forward(x.reshape(6, 2, 4, 5), W, b, (2, 2), (1, 1), (1, 1), 1)
    assert top[0].shape == (2, 3) + exp.shape[1:]
    np.testing.assert_allclose(np.asarray(top[0].data).reshape(exp.shape), exp, rtol=1e-10)


# -------------------------------------------------------------- Deconvolution
DECONV_CASES = {
    "stride_gt_kernel_pad": ("num_output: 2 kernel_size: 2 stride: 3 pad: 1",
                             (3, 3), (1, 1), (1, 1), 1, (2, 3, 3, 4)),
    "group_dil": ("num_output: 4 kernel_size: 3 stride: 2 pad: 1 dilation: 2 group: 2",
                  (2, 2), (1, 1), (2, 2), 2, (1, 4, 3, 3)),
    "rect_group3": ("num_output: 3 kernel_h: 3 kernel_w: 2 stride_h: 4 stride_w: 1 pad_h: 2 "
                    "pad_w: 1 group: 3", (4, 1), (2, 1), (1, 1), 3, (2, 3, 2, 3)),
}


@pytest.mark.parametrize("case", sorted(DECONV_CASES))
def test_deconvolution_is_caffe_conv_backward(case):
    """deconv_layer.cpp: forward = conv backward-data (col2im) of the weights, whose shape is
    (C_in, C_out / group, kh, kw); top size stride*(H-1) + dil*(k-1) + 1 - 2*pad."""
    body, stride, pad, dil, group, shape = DECONV_CASES[case]
    rng = np.random.default_rng(13)
    x = rng.standard_normal(shape)
    layer, bottom, top = run_layer(
        f'name: "d" type: "Deconvolution" convolution_param {{ {body} '
        'weight_filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" std: 1 } }', x)
    W, b = np.array(layer.blobs[0].data), np.array(layer.blobs[1].data)
    cin, og, kh, kw = W.shape
    oh = stride[0] * (shape[2] - 1) + dil[0] * (kh - 1) + 1 - 2 * pad[0]
    ow = stride[1] * (shape[3] - 1) + dil[1] * (kw - 1) + 1 - 2 * pad[1]
    cout = og * group
    assert top[0].shape == (shape[0], cout, oh, ow)
    # the deconv forward is the adjoint of the conv forward (same W, no bias) from top to bottom
    conv = lambda y: caffe_conv_forward(y, W, None, stride, pad, dil, group)  # noqa: E731
    exp = np.zeros((shape[0], cout, oh, ow))
    for idx in np.ndindex(exp.shape):
        e = np.zeros(exp.shape)
        e[idx] = 1
        exp[idx] = (conv(e) * x).sum()
    exp += b[None, :, None, None]
    np.testing.assert_allclose(top[0].data, exp, rtol=1e-10, atol=1e-12)
    td = rng.standard_normal(exp.shape)
    for blob in layer.blobs:
        blob.diff[...] = 0
    np.testing.assert_allclose(backward(layer, bottom, top, td), conv(td), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(layer.blobs[1].diff, td.sum((0, 2, 3)), rtol=1e-12)
    # weight diff: <td, deconv_W(x)> = <conv_W(td), x> is linear in W
    np.testing.assert_allclose(
        layer.blobs[0].diff,
        numeric_vjp(lambda v: caffe_conv_forward(td, v, None, stride, pad, dil, group), W, x),
        rtol=1e-6, atol=1e-8)


# ----------------------------------------------------------------------- Crop
def make_two(text, a, b_shape):
    layer = make_layer(text)
    bottom = [make_blob(a, name="a"), make_blob(np.zeros(b_shape), name="b")]
    top = [Blob(dtype=np.float64, name="t")]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return layer, bottom, top


@pytest.mark.parametrize("param,ref_shape,window", [
    ("axis: 1 offset: 1", (9, 2, 3, 2), (slice(None), slice(1, 3), slice(1, 4), slice(1, 3))),
    ("axis: 1 offset: 0 offset: 2 offset: 1", (9, 3, 2, 3),
     (slice(None), slice(0, 3), slice(2, 4), slice(1, 4))),
    ("axis: -2 offset: 2", (9, 9, 3, 2), (slice(None), slice(None), slice(2, 5), slice(2, 4))),
    ("axis: 0", (1, 2, 2, 2), (slice(0, 1), slice(0, 2), slice(0, 2), slice(0, 2))),
])
def test_crop_offsets_like_caffe(param, ref_shape, window):
    # crop_layer.cpp: offset_size 1 -> that offset on every cropped axis, else offset(i - axis)
    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 4, 5, 4))
    layer, bottom, top = make_two(f'name: "c" type: "Crop" crop_param {{ {param} }}', x, ref_shape)
    np.testing.assert_array_equal(top[0].data, x[window])
    td = rng.standard_normal(top[0].shape)
    top[0].diff[...] = td
    bottom[0].diff[...] = 7.0
    layer.backward(top, [True, False], bottom)
    exp = np.zeros(x.shape)
    exp[window] = td
    np.testing.assert_array_equal(bottom[0].diff, exp)


# --------------------------------------------------------------------- Im2col
def test_im2col_layer_matches_caffe_im2col():
    rng = np.random.default_rng(15)
    x = rng.standard_normal((2, 3, 5, 6))
    layer, bottom, top = run_layer(
        'name: "i" type: "Im2col" convolution_param { kernel_h: 2 kernel_w: 3 stride_h: 2 '
        'stride_w: 1 pad_h: 1 pad_w: 2 dilation: 2 }', x)
    # Im2col's top is the conv's column buffer: an identity conv over it reproduces it
    C, kh, kw = 3, 2, 3
    eye = np.eye(C * kh * kw).reshape(C * kh * kw, C, kh, kw)
    exp = caffe_conv_forward(x, eye, None, (2, 1), (1, 2), (2, 2), 1)
    assert top[0].shape == exp.shape
    np.testing.assert_allclose(top[0].data, exp, rtol=0, atol=0)
    td = rng.standard_normal(exp.shape)
    np.testing.assert_allclose(
        backward(layer, bottom, top, td),
        numeric_vjp(lambda v: caffe_conv_forward(v, eye, None, (2, 1), (1, 2), (2, 2), 1), x, td),
        rtol=1e-6, atol=1e-8)


# ----------------------------------------------------------- Flatten / Reshape
@pytest.mark.parametrize("param,shape", [
    ("shape { dim: 0 dim: -1 }", (2, 12)),
    ("shape { dim: 0 dim: 0 dim: -1 dim: 2 }", (2, 3, 2, 2)),
    ("axis: 1 num_axes: 2 shape { dim: -1 }", (2, 12)),
    ("axis: -1 shape { dim: 1 dim: 1 }", (2, 3, 4, 1, 1)),
    ("axis: 0 num_axes: 1 shape { dim: 1 dim: -1 }", (1, 2, 3, 4)),
    ("axis: 2 num_axes: 0 shape { dim: 1 }", (2, 3, 1, 4)),
    ("axis: 1 num_axes: -1 shape { dim: 0 dim: 2 dim: -1 }", (2, 3, 2, 2)),
])
def test_reshape_like_caffe(param, shape):
    # reshape_layer.cpp: start_axis = axis >= 0 ? axis : num_axes + axis + 1; 0 copies the
    # bottom dim at start_axis + i; -1 is inferred
    x = np.arange(24.0).reshape(2, 3, 4)
    layer, bottom, top = run_layer(f'name: "r" type: "Reshape" reshape_param {{ {param} }}', x)
    assert top[0].shape == shape
    np.testing.assert_array_equal(np.asarray(top[0].data).ravel(), x.ravel())


@pytest.mark.parametrize("param,shape", [
    ("", (2, 60)), ("axis: 2", (2, 3, 20)), ("axis: 1 end_axis: 2", (2, 12, 5)),
    ("axis: -3 end_axis: -2", (2, 12, 5)), ("axis: 0 end_axis: 0", (2, 3, 4, 5)),
])
def test_flatten_axes_like_caffe(param, shape):
    x = np.arange(120.0).reshape(2, 3, 4, 5)
    layer, bottom, top = run_layer(f'name: "f" type: "Flatten" flatten_param {{ {param} }}', x)
    assert top[0].shape == shape


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_pooling_empty_last_window_without_pad(method):
    """No padding, so no clip: ceil leaves a last window starting past the input (kernel 1,
    stride 3, width 5: windows at 0, 3, 6).  Caffe's loops give MAX -FLT_MAX (mask -1) and
    AVE sum 0 over a negative pool_size (-0.0)."""
    x = np.random.default_rng(16).standard_normal((1, 2, 5, 5))
    geom = (1, 1, 3, 3, 0, 0)
    layer, bottom, top = run_layer(f'name: "p" type: "Pooling" pooling_param {{ pool: {method} '
                                   'kernel_size: 1 stride: 3 }', x, 2 if method == "MAX" else 1)
    exp, mask, _ = caffe_pool_forward(x, method, *geom)
    assert top[0].shape == (1, 2, 3, 3)
    np.testing.assert_array_equal(top[0].data, exp)
    if method == "MAX":
        np.testing.assert_array_equal(np.asarray(top[1].data), mask)


def caffe_conv_nd(x, W, b, stride, pad, dil, group):
    """im2col_nd_cpu + gemm for any number of spatial axes (direct sum per output)."""
    n, c = x.shape[:2]
    sp = x.shape[2:]
    o, cg = W.shape[:2]
    ks = W.shape[2:]
    outs = tuple((sp[i] + 2 * pad[i] - (dil[i] * (ks[i] - 1) + 1)) // stride[i] + 1
                 for i in range(len(sp)))
    og = o // group
    top = np.zeros((n, o) + outs)
    for pos in np.ndindex(outs):
        for kpos in np.ndindex(ks):
            src = tuple(pos[i] * stride[i] - pad[i] + kpos[i] * dil[i] for i in range(len(sp)))
            if all(0 <= s < d for s, d in zip(src, sp)):
                for g in range(group):
                    xv = x[(slice(None), slice(g * cg, (g + 1) * cg)) + src]  # (n, cg)
                    wv = W[(slice(g * og, (g + 1) * og), slice(None)) + kpos]  # (og, cg)
                    top[(slice(None), slice(g * og, (g + 1) * og)) + pos] += xv @ wv.T
    if b is not None:
        top += b.reshape((1, o) + (1,) * len(sp))
    return top


def test_convolution_3d_dilation_group_matches_caffe_nd():
    rng = np.random.default_rng(17)
    x = rng.standard_normal((2, 4, 4, 5, 3))
    layer, bottom, top = run_layer(
        'name: "c" type: "Convolution" convolution_param { num_output: 2 group: 2 '
        'kernel_size: 2 kernel_size: 3 kernel_size: 1 stride: 1 stride: 2 stride: 2 '
        'pad: 1 pad: 2 pad: 0 dilation: 2 dilation: 1 dilation: 1 '
        'weight_filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" std: 1 } }', x)
    W, b = np.array(layer.blobs[0].data), np.array(layer.blobs[1].data)
    args = ((1, 2, 2), (1, 2, 0), (2, 1, 1), 2)
    exp = caffe_conv_nd(x, W, b, *args)
    assert top[0].shape == exp.shape
    np.testing.assert_allclose(top[0].data, exp, rtol=1e-10, atol=1e-12)
    td = rng.standard_normal(exp.shape)
    for blob in layer.blobs:
        blob.diff[...] = 0
    got = backward(layer, bottom, top, td)
    np.testing.assert_allclose(got, numeric_vjp(lambda v: caffe_conv_nd(v, W, None, *args), x, td),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(layer.blobs[0].diff,
                               numeric_vjp(lambda v: caffe_conv_nd(x, v, None, *args), W, td),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(layer.blobs[1].diff, td.sum((0, 2, 3, 4)), rtol=1e-12)


@pytest.mark.parametrize("body", [
    "pool: STOCHASTIC kernel_size: 3 pad: 1",       # padding only for AVE and MAX
    "pool: MAX kernel_size: 2 pad: 2",              # CHECK_LT(pad_h_, kernel_h_)
    "pool: AVE global_pooling: true stride: 2",     # global: stride 1 only
    "pool: AVE global_pooling: true pad: 1",        # global: pad 0 only
    "pool: MAX global_pooling: true kernel_size: 2",
    "pool: AVE kernel_h: 2",                        # both kernel_h and kernel_w
])
def test_pooling_setup_checks_like_caffe(body):
    with pytest.raises(ValueError):
        run_layer(f'name: "p" type: "Pooling" pooling_param {{ {body} }}', np.ones((1, 1, 4, 4)))


def test_spp_stochastic_samples_even_in_a_test_net():
    """spp_layer.cpp builds its PoolingLayers from a fresh LayerParameter (phase TRAIN), so a
    STOCHASTIC SPP samples in a TEST net rather than taking the weighted average."""
    x = np.random.default_rng(18).uniform(0.1, 1.0, size=(2, 3, 4, 4))
    layer, bottom, top = run_layer('name: "s" type: "SPP" spp_param { pyramid_height: 1 '
                                   'pool: STOCHASTIC }', x, phase=1)
    out = np.asarray(top[0].data)
    assert out.shape == (2, 3, 1, 1)
    for n in range(2):
        for c in range(3):
            assert np.any(x[n, c] == out[n, c, 0, 0])
    avg = (x ** 2).sum((2, 3)) / x.sum((2, 3))
    assert not np.allclose(out[:, :, 0, 0], avg)
