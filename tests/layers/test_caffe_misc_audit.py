"""Loss, normalization and activation layers under less common parameters, against
direct NumPy transcriptions of BVLC Caffe's layer code (src/caffe/layers/*.cpp)."""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.proto import caffe_pb2
from minicaffe.testing import make_blob, make_layer

LOG_THR = float(np.float32(1e-20))  # Dtype(kLOG_THRESHOLD), a float constant
FLT_MIN = float(np.finfo(np.float32).tiny)  # Dtype(FLT_MIN), widened to double


def build(text, arrays, n_top=1, phase=None, in_place=False):
    layer = make_layer(text, phase=phase)
    bottom = [make_blob(a, name=f"b{i}") for i, a in enumerate(arrays)]
    top = [bottom[0]] if in_place else [Blob(dtype=np.float64, name=f"t{i}") for i in range(n_top)]
    layer.setup(bottom, top)
    return layer, bottom, top


def fwd_bwd(layer, bottom, top, dy, prop=None):
    layer.forward(bottom, top)
    ys = [to_numpy(t.data).copy() for t in top]
    for p in layer.blobs:
        p.diff[...] = 0
    for t, d in zip(top, dy):
        t.diff[...] = d
    layer.backward(top, prop or [True] * len(bottom), bottom)
    return ys, [to_numpy(b.diff).copy() for b in bottom]


# --- SoftmaxWithLoss: softmax_loss_layer.cpp ------------------------------------------------

def caffe_softmax_loss(x, label, axis, ignore, mode, weight):
    outer = int(np.prod(x.shape[:axis]))
    c = x.shape[axis]
    inner = int(np.prod(x.shape[axis + 1:]))
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    prob = e / e.sum(axis=axis, keepdims=True)
    p = prob.reshape(outer, c, inner)
    lab = label.reshape(-1)
    loss, count = 0.0, 0
    diff = p.copy()
    for i in range(outer):
        for j in range(inner):
            lv = int(lab[i * inner + j])
            if ignore is not None and lv == ignore:
                diff[i, :, j] = 0
                continue
            loss -= np.log(max(p[i, lv, j], FLT_MIN))
            diff[i, lv, j] -= 1
            count += 1
    norm = {"FULL": outer * inner, "VALID": count, "BATCH_SIZE": outer, "NONE": 1}[mode]
    norm = max(1.0, norm)
    return loss / norm, prob, (diff * weight / norm).reshape(x.shape)


@pytest.mark.parametrize("mode", ["FULL", "VALID", "BATCH_SIZE", "NONE"])
def test_softmax_loss_axis2_ignore_prob_top_loss_weight(mode):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 2))
    label = rng.integers(0, 4, (2, 3, 2)).astype(float)
    label[0, 1, 0] = label[1, 2, 1] = -1
    text = (f'name: "l" type: "SoftmaxWithLoss" loss_weight: 2 loss_weight: 0 softmax_param '
            f'{{ axis: 2 }} loss_param {{ ignore_label: -1 normalization: {mode} }}')
    layer, bottom, top = build(text, [x, label], n_top=2)
    (loss, prob), (dx, _) = fwd_bwd(layer, bottom, top, [2.0, 0.0], [True, False])
    el, ep, edx = caffe_softmax_loss(x, label, 2, -1, mode, 2.0)
    np.testing.assert_allclose(loss, el, rtol=1e-12)
    np.testing.assert_allclose(prob, ep, rtol=1e-12)
    np.testing.assert_allclose(dx, edx, rtol=1e-12, atol=1e-15)


def test_softmax_loss_all_ignored_and_legacy_normalize_false():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 2, 2))
    label = np.full((3, 1, 2, 2), 2.0)
    # all ignored under VALID: normalizer max(1, 0) = 1, loss 0, gradient 0
    layer, bottom, top = build('name: "l" type: "SoftmaxWithLoss" loss_param { ignore_label: 2 }',
                               [x, label])
    (loss,), (dx, _) = fwd_bwd(layer, bottom, top, [1.0], [True, False])
    assert loss == 0 and not dx.any()
    # normalize: false (legacy) -> BATCH_SIZE; a label blob of shape (N, H*W) is accepted
    # (only the first dimension and the count must match: LossLayer::Reshape, Reshape)
    label = rng.integers(0, 4, (3, 4)).astype(float)
    layer, bottom, top = build('name: "l" type: "SoftmaxWithLoss" loss_param { normalize: false }',
                               [x, label])
    (loss,), (dx, _) = fwd_bwd(layer, bottom, top, [1.0], [True, False])
    el, _, edx = caffe_softmax_loss(x, label, 1, None, "BATCH_SIZE", 1.0)
    np.testing.assert_allclose(loss, el, rtol=1e-12)
    np.testing.assert_allclose(dx, edx, rtol=1e-12, atol=1e-15)


# --- SigmoidCrossEntropyLoss: sigmoid_cross_entropy_loss_layer.cpp ------------------------------

@pytest.mark.parametrize("norm", ["", "normalization: VALID", "normalization: FULL",
                                  "normalize: true", "normalization: NONE"])
def test_sigmoid_cross_entropy_ignore_and_normalization(norm):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 5)) * 3
    t = rng.integers(0, 2, (3, 5)).astype(float)
    t[0, 1] = t[2, 4] = t[1, 0] = -1
    text = f'name: "l" type: "SigmoidCrossEntropyLoss" loss_param {{ ignore_label: -1 {norm} }}'
    layer, bottom, top = build(text, [x, t])
    (loss,), (dx, _) = fwd_bwd(layer, bottom, top, [3.0], [True, False])
    el, valid = 0.0, 0
    edx = 1 / (1 + np.exp(-x)) - t
    for i in range(x.size):
        xi, ti = x.flat[i], t.flat[i]
        if int(ti) == -1:
            edx.flat[i] = 0
            continue
        el -= xi * (ti - (xi >= 0)) - np.log(1 + np.exp(xi - 2 * xi * (xi >= 0)))
        valid += 1
    mode = {"": "BATCH_SIZE", "normalize: true": "VALID"}.get(norm, norm.split(": ")[-1])
    n = max(1.0, {"FULL": 15, "VALID": valid, "BATCH_SIZE": 3, "NONE": 1}[mode])
    np.testing.assert_allclose(loss, el / n, rtol=1e-12)
    np.testing.assert_allclose(dx, edx * 3.0 / n, rtol=1e-12)


# --- EuclideanLoss: euclidean_loss_layer.cpp ----------------------------------------------------

def test_euclidean_divisor_is_num_and_both_bottoms_get_gradients():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((4, 3, 2)), rng.standard_normal((4, 6))
    layer, bottom, top = build('name: "l" type: "EuclideanLoss"', [a, b])
    (loss,), (da, db) = fwd_bwd(layer, bottom, top, [0.5])
    d = a - b.reshape(a.shape)
    np.testing.assert_allclose(loss, (d ** 2).sum() / 4 / 2, rtol=1e-12)
    np.testing.assert_allclose(da, 0.5 * d / 4, rtol=1e-12)
    np.testing.assert_allclose(db, -0.5 * d.reshape(b.shape) / 4, rtol=1e-12)


# --- Accuracy: accuracy_layer.cpp ---------------------------------------------------------------

def test_accuracy_top2_ties_axis_ignore_per_class():
    rng = np.random.default_rng(4)
    # scores (outer=2, inner=3) along axis 2 of a (2, 3, C=4) blob, rounded so that ties occur
    x = np.round(rng.uniform(0, 1, (2, 3, 4)) * 3) / 3
    label = rng.integers(0, 4, (2, 3)).astype(float)
    label[1, 1] = 7
    text = 'name: "a" type: "Accuracy" accuracy_param { top_k: 2 axis: -1 ignore_label: 7 }'
    layer, bottom, top = build(text, [x, label], n_top=2)
    layer.forward(bottom, top)
    acc, cnt, hits, nums = 0, 0, np.zeros(4), np.zeros(4)
    for i in range(6):
        row, lv = x.reshape(6, 4)[i], int(label.flat[i])
        if lv == 7:
            continue
        nums[lv] += 1
        better = -1
        for k in range(4):
            if better >= 2:
                break
            better += row[k] >= row[lv]
        if better < 2:
            acc += 1
            hits[lv] += 1
        cnt += 1
    np.testing.assert_allclose(to_numpy(top[0].data), acc / cnt)
    np.testing.assert_allclose(to_numpy(top[1].data), np.where(nums == 0, 0, hits / np.maximum(nums, 1)))


# --- ArgMax: argmax_layer.cpp -------------------------------------------------------------------

def caffe_argmax_rows(rows, k):
    """std::partial_sort with std::greater<pair<value, index>>: ties -> larger index first."""
    out = []
    for r in rows:
        pairs = sorted(((v, j) for j, v in enumerate(r)), reverse=True)[:k]
        out.append(pairs)
    return out


@pytest.mark.parametrize("out_max_val", [False, True])
def test_argmax_no_axis_topk_ties(out_max_val):
    x = np.array([[[1.0, 3.0], [3.0, 2.0]], [[0.5, 0.5], [0.5, 0.1]]])  # (2, 2, 2): dim 4
    text = f'name: "m" type: "ArgMax" argmax_param {{ top_k: 3 out_max_val: {str(out_max_val).lower()} }}'
    layer, bottom, top = build(text, [x])
    layer.forward(bottom, top)
    y = to_numpy(top[0].data)
    assert y.shape == (2, 2 if out_max_val else 1, 3)
    for i, pairs in enumerate(caffe_argmax_rows(x.reshape(2, 4), 3)):
        np.testing.assert_array_equal(y[i, 0], [j for _, j in pairs])
        if out_max_val:
            np.testing.assert_array_equal(y[i, 1], [v for v, _ in pairs])


@pytest.mark.parametrize("out_max_val", [False, True])
def test_argmax_axis1_topk(out_max_val):
    rng = np.random.default_rng(5)
    x = np.round(rng.uniform(0, 2, (2, 4, 3)))
    text = (f'name: "m" type: "ArgMax" argmax_param {{ top_k: 2 axis: 1 '
            f'out_max_val: {str(out_max_val).lower()} }}')
    layer, bottom, top = build(text, [x])
    layer.forward(bottom, top)
    y = to_numpy(top[0].data)
    assert y.shape == (2, 2, 3)
    rows = np.moveaxis(x, 1, -1).reshape(6, 4)
    for r, pairs in enumerate(caffe_argmax_rows(rows, 2)):
        i, j = divmod(r, 3)
        np.testing.assert_array_equal(y[i, :, j], [v if out_max_val else idx for v, idx in pairs])


# --- BatchNorm: batch_norm_layer.cpp ------------------------------------------------------------

def test_batchnorm_train_moving_average_eps_and_backward():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 2, 2, 2))
    text = ('name: "bn" type: "BatchNorm" batch_norm_param { moving_average_fraction: 0.9 '
            'eps: 0.001 }')
    layer, bottom, top = build(text, [x], phase=caffe_pb2.TRAIN)
    m0, v0 = np.array([0.3, -0.2]), np.array([1.5, 0.7])
    layer.blobs[0].data[...] = m0
    layer.blobs[1].data[...] = v0
    layer.blobs[2].data[...] = 2.0
    dy = rng.standard_normal(x.shape)
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    var = ((x - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True)
    std = np.sqrt(var + float(np.float32(0.001)))  # eps is a proto float
    ey = (x - mean) / std
    np.testing.assert_allclose(y, ey, rtol=1e-12)
    m = x.size / 2
    maf = float(np.float32(0.9))  # a proto float, widened to Dtype
    np.testing.assert_allclose(to_numpy(layer.blobs[2].data), [2.0 * maf + 1])
    np.testing.assert_allclose(to_numpy(layer.blobs[0].data), mean.ravel() + maf * m0, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(layer.blobs[1].data),
                               m / (m - 1) * var.ravel() + maf * v0, rtol=1e-12)
    ax = (0, 2, 3)
    edx = (dy - dy.mean(axis=ax, keepdims=True)
           - (dy * ey).mean(axis=ax, keepdims=True) * ey) / std
    np.testing.assert_allclose(dx, edx, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("factor", [0.0, 4.0])
def test_batchnorm_test_phase_global_stats_scale_factor(factor):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 2))
    layer, bottom, top = build('name: "bn" type: "BatchNorm"', [x], phase=caffe_pb2.TEST)
    m0, v0 = np.array([0.4, -1.0, 2.0]), np.array([2.0, 0.5, 3.0])
    layer.blobs[0].data[...] = m0
    layer.blobs[1].data[...] = v0
    layer.blobs[2].data[...] = factor
    dy = rng.standard_normal(x.shape)
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    s = 0 if factor == 0 else 1 / factor
    std = np.sqrt(s * v0 + float(np.float32(1e-5))).reshape(1, 3, 1)
    np.testing.assert_allclose(y, (x - s * m0.reshape(1, 3, 1)) / std, rtol=1e-12)
    np.testing.assert_allclose(dx, dy / std, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(layer.blobs[2].data), [factor])  # untouched


# --- Scale / Bias: scale_layer.cpp, bias_layer.cpp ------------------------------------------------

def bshape(xshape, axis, pshape):
    return (1,) * axis + tuple(pshape) + (1,) * (len(xshape) - axis - len(pshape))


@pytest.mark.parametrize("params,axis,pshape", [
    ("axis: 0 num_axes: -1", 0, (2, 3, 4)),
    ("axis: -2 num_axes: 1", 1, (3,)),
    ("num_axes: 0", 0, ()),
    ("axis: 2 num_axes: -1 bias_term: true bias_filler { type: 'constant' value: 0.7 }", 2, (4,)),
])
@pytest.mark.parametrize("in_place", [False, True])
def test_scale_param_axes_bias_in_place(params, axis, pshape, in_place):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 4))
    layer, bottom, top = build(f'name: "s" type: "Scale" scale_param {{ {params} }}', [x],
                               in_place=in_place)
    assert layer.blobs[0].shape == pshape
    s = rng.uniform(0.5, 1.5, pshape)
    layer.blobs[0].data[...] = s
    bias = "bias_term" in params
    if bias:
        np.testing.assert_array_equal(to_numpy(layer.blobs[1].data), np.full(pshape, np.float32(0.7)))
    dy = rng.standard_normal(x.shape)
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    sb = s.reshape(bshape(x.shape, axis, pshape))
    b = float(np.float32(0.7)) if bias else 0.0
    np.testing.assert_allclose(y, x * sb + b, rtol=1e-12)
    np.testing.assert_allclose(dx, dy * sb, rtol=1e-12)
    red = tuple(i for i in range(3) if not axis <= i < axis + len(pshape))
    np.testing.assert_allclose(to_numpy(layer.blobs[0].diff), (dy * x).sum(axis=red).reshape(pshape),
                               rtol=1e-12)
    if bias:
        np.testing.assert_allclose(to_numpy(layer.blobs[1].diff), dy.sum(axis=red), rtol=1e-12)


@pytest.mark.parametrize("kind", ["Scale", "Bias"])
def test_scale_bias_second_bottom(kind):
    rng = np.random.default_rng(9)
    x, s = rng.standard_normal((2, 3, 4, 2)), rng.standard_normal((3, 4))
    field = "scale_param" if kind == "Scale" else "bias_param"
    layer, bottom, top = build(f'name: "s" type: "{kind}" {field} {{ axis: 1 }}', [x, s])
    assert not layer.blobs
    dy = rng.standard_normal(x.shape)
    (y,), (dx, ds) = fwd_bwd(layer, bottom, top, [dy])
    sb = s.reshape(1, 3, 4, 1)
    if kind == "Scale":
        np.testing.assert_allclose(y, x * sb, rtol=1e-12)
        np.testing.assert_allclose(dx, dy * sb, rtol=1e-12)
        np.testing.assert_allclose(ds, (dy * x).sum(axis=(0, 3)), rtol=1e-12)
    else:
        np.testing.assert_allclose(y, x + sb, rtol=1e-12)
        np.testing.assert_allclose(dx, dy, rtol=1e-12)
        np.testing.assert_allclose(ds, dy.sum(axis=(0, 3)), rtol=1e-12)


def test_bias_param_axis_num_axes():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 3, 4))
    layer, bottom, top = build('name: "b" type: "Bias" bias_param { axis: 1 num_axes: 2 '
                               'filler { type: "constant" value: 0.25 } }', [x])
    assert layer.blobs[0].shape == (3, 4)
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].data), 0.25)
    dy = rng.standard_normal(x.shape)
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    np.testing.assert_allclose(y, x + 0.25)
    np.testing.assert_allclose(to_numpy(layer.blobs[0].diff), dy.sum(axis=0), rtol=1e-12)


# --- PReLU, ELU, ReLU: prelu_layer.cpp, elu_layer.cpp, relu_layer.cpp -----------------------------

@pytest.mark.parametrize("shared", [False, True])
def test_prelu_channel_shared_in_place(shared):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 2, 2))
    x[0, 0, 0, 0] = 0.0
    text = f'name: "p" type: "PReLU" prelu_param {{ channel_shared: {str(shared).lower()} }}'
    layer, bottom, top = build(text, [x], in_place=True)
    # Caffe: channel_shared -> Blob(vector<int>(0)), a 0-axis scalar
    assert layer.blobs[0].shape == (() if shared else (3,))
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].data), np.float32(0.25))
    a = rng.uniform(0.1, 0.5, layer.blobs[0].shape)
    layer.blobs[0].data[...] = a
    dy = rng.standard_normal(x.shape)
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    ab = a.reshape(1, -1, 1, 1) if not shared else a
    np.testing.assert_allclose(y, np.maximum(x, 0) + ab * np.minimum(x, 0), rtol=1e-12)
    np.testing.assert_allclose(dx, dy * ((x > 0) + ab * (x <= 0)), rtol=1e-12)
    ga = dy * x * (x <= 0)
    ga = ga.sum() if shared else ga.sum(axis=(0, 2, 3))
    np.testing.assert_allclose(to_numpy(layer.blobs[0].diff).reshape(-1), np.ravel(ga), rtol=1e-12)


def test_elu_alpha_and_relu_negative_slope():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 4))
    x[0, 0] = 0.0
    dy = rng.standard_normal(x.shape)
    layer, bottom, top = build('name: "e" type: "ELU" elu_param { alpha: 0.3 }', [x])
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    al = float(np.float32(0.3))
    ey = np.where(x > 0, x, al * (np.exp(x) - 1))
    np.testing.assert_allclose(y, ey, rtol=1e-12)
    np.testing.assert_allclose(dx, np.where(x > 0, dy, dy * (ey + al)), rtol=1e-12)
    layer, bottom, top = build('name: "r" type: "ReLU" relu_param { negative_slope: 0.2 }', [x],
                               in_place=True)
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    sl = float(np.float32(0.2))
    np.testing.assert_allclose(y, np.maximum(x, 0) + sl * np.minimum(x, 0), rtol=1e-12)
    np.testing.assert_allclose(dx, dy * ((x > 0) + sl * (x <= 0)), rtol=1e-12)


# --- Eltwise: eltwise_layer.cpp -----------------------------------------------------------------

def test_eltwise_max_ties_and_backward_routing():
    a = np.array([1.0, 2.0, 3.0, 0.0, 5.0])
    b = np.array([1.0, 1.0, 4.0, 0.0, 5.0])
    c = np.array([1.0, 2.0, 4.0, 2.0, 0.0])
    layer, bottom, top = build('name: "e" type: "Eltwise" eltwise_param { operation: MAX }', [a, b, c])
    dy = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
    (y,), dxs = fwd_bwd(layer, bottom, top, [dy])
    # Caffe: mask = (a > b ? 0 : 1); then blob i >= 2 wins only if strictly greater
    mask = np.where(a > b, 0, 1)
    top_ = np.where(a > b, a, b)
    mask = np.where(c > top_, 2, mask)
    np.testing.assert_array_equal(y, np.maximum(np.maximum(a, b), c))
    for i, dx in enumerate(dxs):
        np.testing.assert_array_equal(dx, np.where(mask == i, dy, 0))


def test_eltwise_sum_coeff_and_prod_grads():
    rng = np.random.default_rng(13)
    xs = [rng.standard_normal((2, 3)) for _ in range(3)]
    xs[1][0, 0] = 0.0
    dy = rng.standard_normal((2, 3))
    layer, bottom, top = build('name: "e" type: "Eltwise" eltwise_param { operation: SUM '
                               'coeff: 1 coeff: -0.5 coeff: 2 }', xs)
    (y,), dxs = fwd_bwd(layer, bottom, top, [dy])
    co = [1.0, -0.5, 2.0]
    np.testing.assert_allclose(y, sum(c * x for c, x in zip(co, xs)), rtol=1e-12)
    for c, dx in zip(co, dxs):
        np.testing.assert_allclose(dx, c * dy, rtol=1e-12)
    # PROD, stable_prod_grad (default): dx_i = dy * prod_{j != i} x_j, exact at a zero input
    layer, bottom, top = build('name: "e" type: "Eltwise" eltwise_param { operation: PROD }', xs)
    (y,), dxs = fwd_bwd(layer, bottom, top, [dy])
    np.testing.assert_allclose(y, xs[0] * xs[1] * xs[2], rtol=1e-12)
    for i, dx in enumerate(dxs):
        others = np.prod([x for j, x in enumerate(xs) if j != i], axis=0)
        np.testing.assert_allclose(dx, dy * others, rtol=1e-12)
    # stable_prod_grad: false: dx_i = dy * top / x_i
    xs[1][0, 0] = 0.7
    layer, bottom, top = build('name: "e" type: "Eltwise" eltwise_param { operation: PROD '
                               'stable_prod_grad: false }', xs)
    (y,), dxs = fwd_bwd(layer, bottom, top, [dy])
    for x, dx in zip(xs, dxs):
        np.testing.assert_allclose(dx, dy * y / x, rtol=1e-12)


# --- Concat / Slice: concat_layer.cpp, slice_layer.cpp ------------------------------------------

def test_concat_dim_legacy_and_negative_axis():
    rng = np.random.default_rng(14)
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 1))
    for p in ("concat_dim: 2", "axis: -1"):
        layer, bottom, top = build(f'name: "c" type: "Concat" concat_param {{ {p} }}', [a, b])
        dy = rng.standard_normal((2, 3, 5))
        (y,), (da, db) = fwd_bwd(layer, bottom, top, [dy])
        np.testing.assert_array_equal(y, np.concatenate([a, b], axis=2))
        np.testing.assert_array_equal(da, dy[..., :4])
        np.testing.assert_array_equal(db, dy[..., 4:])


def test_slice_points_legacy_dim_and_even_split():
    rng = np.random.default_rng(15)
    x = rng.standard_normal((2, 6, 3))
    layer, bottom, top = build('name: "s" type: "Slice" slice_param { slice_dim: 1 '
                               'slice_point: 1 slice_point: 4 }', [x], n_top=3)
    dys = [rng.standard_normal((2, n, 3)) for n in (1, 3, 2)]
    ys, (dx,) = fwd_bwd(layer, bottom, top, dys)
    for y, e in zip(ys, np.split(x, [1, 4], axis=1)):
        np.testing.assert_array_equal(y, e)
    np.testing.assert_array_equal(dx, np.concatenate(dys, axis=1))
    layer, bottom, top = build('name: "s" type: "Slice" slice_param { axis: -1 }', [x], n_top=3)
    layer.forward(bottom, top)
    for i, t in enumerate(top):
        np.testing.assert_array_equal(to_numpy(t.data), x[..., i:i + 1])


# --- Reduction: reduction_layer.cpp -------------------------------------------------------------

@pytest.mark.parametrize("op", ["SUM", "ASUM", "SUMSQ", "MEAN"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_reduction_ops_axis_coeff(op, axis):
    rng = np.random.default_rng(16)
    x = rng.standard_normal((2, 3, 4))
    text = f'name: "r" type: "Reduction" reduction_param {{ operation: {op} axis: {axis} coeff: -1.5 }}'
    layer, bottom, top = build(text, [x])
    ax = axis % 3
    num, dim = int(np.prod(x.shape[:ax])), int(np.prod(x.shape[ax:]))
    dy = rng.standard_normal(x.shape[:ax])
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    assert y.shape == x.shape[:ax]
    xf, dyf = x.reshape(num, dim), dy.reshape(num, 1)
    coeff = -1.5 / dim if op == "MEAN" else -1.5
    ey = {"SUM": xf.sum(1), "ASUM": np.abs(xf).sum(1), "SUMSQ": (xf ** 2).sum(1),
          "MEAN": xf.sum(1)}[op] * coeff
    edx = {"SUM": np.ones_like(xf), "ASUM": np.sign(xf), "SUMSQ": 2 * xf,
           "MEAN": np.ones_like(xf)}[op] * coeff * dyf
    np.testing.assert_allclose(y.reshape(-1), ey, rtol=1e-12)
    np.testing.assert_allclose(dx.reshape(num, dim), edx, rtol=1e-12)


# --- Softmax: softmax_layer.cpp; Dropout: dropout_layer.cpp ---------------------------------------

def test_softmax_axis_negative():
    rng = np.random.default_rng(17)
    x = rng.standard_normal((2, 3, 4))
    layer, bottom, top = build('name: "s" type: "Softmax" softmax_param { axis: -2 }', [x])
    dy = rng.standard_normal(x.shape)
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    e = np.exp(x - x.max(axis=1, keepdims=True))
    ey = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(y, ey, rtol=1e-12)
    np.testing.assert_allclose(dx, (dy - (dy * ey).sum(axis=1, keepdims=True)) * ey, rtol=1e-12)


def test_dropout_train_scale_and_test_passthrough():
    rng = np.random.default_rng(18)
    x = rng.uniform(1, 2, (4, 50))
    dy = rng.standard_normal(x.shape)
    text = 'name: "d" type: "Dropout" dropout_param { dropout_ratio: 0.3 }'
    layer, bottom, top = build(text, [x], phase=caffe_pb2.TRAIN)
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    scale = 1.0 / (1.0 - float(np.float32(0.3)))
    mask = y != 0
    assert 0 < mask.mean() < 1
    np.testing.assert_allclose(y, x * mask * scale, rtol=1e-12)
    np.testing.assert_allclose(dx, dy * mask * scale, rtol=1e-12)
    layer, bottom, top = build(text, [x], phase=caffe_pb2.TEST)
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(dx, dy)


# --- more corners: Scale with a scalar / second bottom and bias, BatchNorm's explicit
# use_global_stats, SoftmaxWithLoss's prob top in a net (loss_layer.cpp: only top 0 weighs 1) -----

def test_scale_second_bottom_with_bias_term_and_scalar_scale():
    rng = np.random.default_rng(19)
    x, s = rng.standard_normal((2, 3, 2)), rng.standard_normal((3,))
    text = ('name: "s" type: "Scale" scale_param { axis: 1 bias_term: true '
            'bias_filler { type: "constant" value: -0.5 } }')
    layer, bottom, top = build(text, [x, s])
    assert len(layer.blobs) == 1 and layer.blobs[0].shape == (3,)  # only the bias is a param
    dy = rng.standard_normal(x.shape)
    (y,), (dx, ds) = fwd_bwd(layer, bottom, top, [dy])
    np.testing.assert_allclose(y, x * s.reshape(1, 3, 1) - 0.5, rtol=1e-12)
    np.testing.assert_allclose(ds, (dy * x).sum(axis=(0, 2)), rtol=1e-12)
    np.testing.assert_allclose(to_numpy(layer.blobs[0].diff), dy.sum(axis=(0, 2)), rtol=1e-12)
    # a 0-axis second bottom: Caffe uses axis_ = 0 whatever scale_param.axis says
    layer, bottom, top = build('name: "s" type: "Scale" scale_param { axis: 2 }',
                               [x, np.array(1.7)])
    (y,), (dx, ds) = fwd_bwd(layer, bottom, top, [dy])
    np.testing.assert_allclose(y, 1.7 * x, rtol=1e-12)
    np.testing.assert_allclose(ds, (dy * x).sum(), rtol=1e-12)


@pytest.mark.parametrize("phase,ugs", [(caffe_pb2.TRAIN, True), (caffe_pb2.TEST, False)])
def test_batchnorm_explicit_use_global_stats_overrides_phase(phase, ugs):
    rng = np.random.default_rng(20)
    x = rng.standard_normal((4, 2))
    text = f'name: "bn" type: "BatchNorm" batch_norm_param {{ use_global_stats: {str(ugs).lower()} }}'
    layer, bottom, top = build(text, [x], phase=phase)
    layer.blobs[0].data[...] = [1.0, 2.0]
    layer.blobs[1].data[...] = [4.0, 9.0]
    layer.blobs[2].data[...] = 2.0
    dy = rng.standard_normal(x.shape)
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    eps = float(np.float32(1e-5))
    if ugs:
        std = np.sqrt(np.array([2.0, 4.5]) + eps)
        np.testing.assert_allclose(y, (x - [0.5, 1.0]) / std, rtol=1e-12)
        np.testing.assert_allclose(dx, dy / std, rtol=1e-12)
        np.testing.assert_allclose(to_numpy(layer.blobs[2].data), [2.0])
    else:  # batch statistics, and the moving averages update even in TEST
        mean, var = x.mean(0), x.var(0)
        np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + eps), rtol=1e-12)
        maf = float(np.float32(0.999))
        np.testing.assert_allclose(to_numpy(layer.blobs[2].data), [2.0 * maf + 1], rtol=1e-12)
        np.testing.assert_allclose(to_numpy(layer.blobs[0].data), mean + maf * np.array([1.0, 2.0]),
                                   rtol=1e-12)


def test_softmax_loss_prob_top_in_a_net_needs_a_loss_weight_per_top():
    """LossLayer::LayerSetUp adds loss_weight 1 when none is given, then Layer::SetLossWeights
    CHECKs one loss_weight per top: a (loss, prob) SoftmaxWithLoss needs ``loss_weight: 1
    loss_weight: 0``; without it Caffe refuses the net."""
    from minicaffe.net import Net
    from minicaffe.proto import parse_text
    text = """
    force_backward: true
    layer { name: "in" type: "Input" top: "x" top: "label"
            input_param { shape { dim: 3 dim: 4 } shape { dim: 3 } } }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "x" bottom: "label" top: "loss" top: "prob"
            %s loss_param { normalization: BATCH_SIZE } }
    """
    with pytest.raises(ValueError, match="loss_weight"):
        Net(parse_text(text % "", caffe_pb2.NetParameter, filename="<t>"), caffe_pb2.TRAIN)
    net = Net(parse_text(text % "loss_weight: 1 loss_weight: 0", caffe_pb2.NetParameter,
                         filename="<t>"), caffe_pb2.TRAIN, dtype=np.float64)
    rng = np.random.default_rng(21)
    x, label = rng.standard_normal((3, 4)), np.array([0.0, 3.0, 1.0])
    out = net.forward(x=x, label=label)
    el, ep, edx = caffe_softmax_loss(x, label, 1, None, "BATCH_SIZE", 1.0)
    np.testing.assert_allclose(out["loss"], el, rtol=1e-12)
    np.testing.assert_allclose(out["prob"], ep, rtol=1e-12)
    net.backward()
    np.testing.assert_allclose(to_numpy(net.blobs["x"].diff), edx, rtol=1e-12)


def test_softmax_loss_flt_min_clamp_in_double_and_batchnorm_single_sample():
    # log(max(p, Dtype(FLT_MIN))): a probability below FLT_MIN gives -log(FLT_MIN) even in double
    x = np.array([[0.0, -200.0, 1.0], [3.0, -1000.0, 0.0]])
    lab = np.array([1.0, 1.0])
    layer, bottom, top = build('name: "l" type: "SoftmaxWithLoss"', [x, lab])
    (loss,), (dx, _) = fwd_bwd(layer, bottom, top, [1.0], [True, False])
    el, _, edx = caffe_softmax_loss(x, lab, 1, None, "VALID", 1.0)
    np.testing.assert_allclose(loss, -np.log(FLT_MIN), rtol=1e-14)
    np.testing.assert_allclose(loss, el, rtol=1e-14)
    np.testing.assert_allclose(dx, edx, rtol=1e-12)
    # BatchNorm with m = N*H*W = 1: bias_correction_factor is 1 (m > 1 ? m / (m - 1) : 1)
    x = np.array([[0.3, -2.0, 5.0]])
    layer, bottom, top = build('name: "bn" type: "BatchNorm"', [x], phase=caffe_pb2.TRAIN)
    for p in layer.blobs:
        p.data[...] = 1.0
    layer.forward(bottom, top)
    maf = float(np.float32(0.999))
    np.testing.assert_array_equal(to_numpy(top[0].data), 0.0)
    np.testing.assert_allclose(to_numpy(layer.blobs[0].data), x[0] + maf, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(layer.blobs[1].data), [maf] * 3, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(layer.blobs[2].data), [maf + 1], rtol=1e-12)


def test_batchnorm_in_place_train_backward_and_scale_bias_default_fillers():
    rng = np.random.default_rng(22)
    x = rng.standard_normal((3, 2, 2))
    dy = rng.standard_normal(x.shape)
    layer, bottom, top = build('name: "bn" type: "BatchNorm" batch_norm_param { eps: 0.01 }', [x],
                               phase=caffe_pb2.TRAIN, in_place=True)
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    ax = (0, 2)
    mean, var = x.mean(axis=ax, keepdims=True), x.var(axis=ax, keepdims=True)
    std = np.sqrt(var + float(np.float32(0.01)))
    ey = (x - mean) / std
    np.testing.assert_allclose(y, ey, rtol=1e-12)
    edx = (dy - dy.mean(axis=ax, keepdims=True) - (dy * ey).mean(axis=ax, keepdims=True) * ey) / std
    np.testing.assert_allclose(dx, edx, rtol=1e-10, atol=1e-13)
    # Scale: filler defaults to constant 1, bias_filler to constant 0; Bias: constant 0
    layer, *_ = build('name: "s" type: "Scale" scale_param { bias_term: true }', [x])
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].data), [1.0, 1.0])
    np.testing.assert_array_equal(to_numpy(layer.blobs[1].data), [0.0, 0.0])
    layer, *_ = build('name: "b" type: "Bias"', [x])
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].data), [0.0, 0.0])


def test_clip_bounds_inclusive_swish_beta_threshold_strict():
    x = np.array([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0])
    dy = np.arange(1.0, 8.0)
    # clip_layer.cpp: backward passes where min <= x <= max (bounds included)
    layer, bottom, top = build('name: "c" type: "Clip" clip_param { min: -1 max: 1 }', [x])
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    np.testing.assert_array_equal(y, np.clip(x, -1, 1))
    np.testing.assert_array_equal(dx, dy * ((x >= -1) & (x <= 1)))
    # swish_layer.cpp: dx = dy * (beta * y + sigmoid(beta x) * (1 - beta * y))
    layer, bottom, top = build('name: "s" type: "Swish" swish_param { beta: 1.5 }', [x])
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [dy])
    s = 1 / (1 + np.exp(-1.5 * x))
    np.testing.assert_allclose(y, x * s, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(dx, dy * (1.5 * y + s * (1 - 1.5 * y)), rtol=1e-12)
    # threshold_layer.cpp: y = x > threshold (strict)
    layer, bottom, top = build('name: "t" type: "Threshold" threshold_param { threshold: 0.5 }', [x])
    layer.forward(bottom, top)
    np.testing.assert_array_equal(to_numpy(top[0].data), (x > 0.5).astype(float))


# --- other losses: hinge_loss_layer.cpp, contrastive_loss_layer.cpp, infogain_loss_layer.cpp,
# multinomial_logistic_loss_layer.cpp ------------------------------------------------------------

@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_hinge_loss_norms(norm):
    rng = np.random.default_rng(23)
    x, lab = rng.standard_normal((4, 5)), np.array([0.0, 3.0, 4.0, 1.0])
    layer, bottom, top = build(f'name: "h" type: "HingeLoss" hinge_loss_param {{ norm: {norm} }}',
                               [x, lab])
    (y,), (dx, _) = fwd_bwd(layer, bottom, top, [0.7], [True, False])
    r = np.arange(4), lab.astype(int)
    L = x.copy()
    L[r] *= -1
    L = np.maximum(0, 1 + L)
    D = L.copy()
    D[r] *= -1
    ey = np.abs(L).sum() / 4 if norm == "L1" else (L * L).sum() / 4
    edx = np.sign(D) * 0.7 / 4 if norm == "L1" else 2 * D * 0.7 / 4
    np.testing.assert_allclose(y, ey, rtol=1e-12)
    np.testing.assert_allclose(dx, edx, rtol=1e-12)


@pytest.mark.parametrize("legacy", [False, True])
def test_contrastive_loss_legacy_version(legacy):
    rng = np.random.default_rng(24)
    a, b = rng.standard_normal((6, 3)) * 0.5, rng.standard_normal((6, 3)) * 0.5
    sim = np.array([1.0, 0, 0, 1, 0, 0])
    text = (f'name: "c" type: "ContrastiveLoss" contrastive_loss_param {{ margin: 1.5 '
            f'legacy_version: {str(legacy).lower()} }}')
    layer, bottom, top = build(text, [a, b, sim])
    (y,), (da, db, _) = fwd_bwd(layer, bottom, top, [0.7], [True, True, False])
    d = a - b
    dsq = (d * d).sum(1)
    m = float(np.float32(1.5))
    loss = 0.0
    for i in range(6):
        if int(sim[i]):
            loss += dsq[i]
        elif legacy:
            loss += max(m - dsq[i], 0.0)
        else:
            loss += max(m - np.sqrt(dsq[i]), 0.0) ** 2
    np.testing.assert_allclose(y, loss / 6 / 2, rtol=1e-12)
    for got, sign in ((da, 1), (db, -1)):
        alpha = sign * 0.7 / 6
        g = np.zeros_like(a)
        for j in range(6):
            if int(sim[j]):
                g[j] = alpha * d[j]
                continue
            if legacy:
                mdist, beta = m - dsq[j], -alpha
            else:
                dist = np.sqrt(dsq[j])
                mdist = m - dist
                beta = -alpha * mdist / (dist + 1e-4)
            g[j] = beta * d[j] if mdist > 0 else 0.0
        np.testing.assert_allclose(got, g, rtol=1e-12)


def test_infogain_loss_axis_ignore_full_and_multinomial_logistic():
    rng = np.random.default_rng(25)
    x, lab, H = rng.standard_normal((2, 3, 2)), np.array([[0.0, 2], [1, 5]]), rng.uniform(0, 1, (3, 3))
    text = ('name: "i" type: "InfogainLoss" infogain_loss_param { axis: 1 } '
            'loss_param { ignore_label: 5 normalization: FULL }')
    layer, bottom, top = build(text, [x, lab, H])
    (y,), (dx, _, _) = fwd_bwd(layer, bottom, top, [0.7], [True, False, False])
    p = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    loss, g = 0.0, np.zeros_like(x)
    for i in range(2):
        for j in range(2):
            lv = int(lab[i, j])
            if lv == 5:
                continue
            loss -= (H[lv] * np.log(np.maximum(p[i, :, j], LOG_THR))).sum()
            g[i, :, j] = p[i, :, j] * H[lv].sum() - H[lv]
    np.testing.assert_allclose(y, loss / 4, rtol=1e-12)
    np.testing.assert_allclose(dx, g * 0.7 / 4, rtol=1e-12, atol=1e-16)
    # MultinomialLogisticLoss: -sum log(max(p[label], Dtype(kLOG_THRESHOLD))) / num, where
    # kLOG_THRESHOLD is `const float kLOG_THRESHOLD = 1e-20` (loss_layer.hpp): in double it
    # is float32(1e-20) widened, 9.99999968e-21, not 1e-20
    prob = np.array([[0.2, 0.8, 0.0], [0.5, 0.25, 0.25]])
    lab = np.array([2.0, 1.0])
    layer, bottom, top = build('name: "m" type: "MultinomialLogisticLoss"', [prob, lab])
    (y,), (dp, _) = fwd_bwd(layer, bottom, top, [0.7], [True, False])
    np.testing.assert_allclose(y, -(np.log(LOG_THR) + np.log(0.25)) / 2, rtol=1e-13)
    edp = np.zeros_like(prob)
    edp[0, 2], edp[1, 1] = -0.7 / 2 / LOG_THR, -0.7 / 2 / 0.25
    np.testing.assert_allclose(dp, edp, rtol=1e-12)


def test_proto_float_parameters_are_widened_float32_values():
    """Caffe's layer parameters are proto floats widened to Dtype: in double, coeff 0.1 is
    float32(0.1); Reduction MEAN divides that coeff by dim (reduction_layer.cpp)."""
    f = lambda v: float(np.float32(v))  # noqa: E731
    rng = np.random.default_rng(26)
    x, x2 = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    layer, bottom, top = build('name: "e" type: "Eltwise" eltwise_param { coeff: 0.1 coeff: 0.7 }',
                               [x, x2])
    (y,), (dx, dx2) = fwd_bwd(layer, bottom, top, [np.ones((2, 3))])
    np.testing.assert_allclose(y, f(0.1) * x + f(0.7) * x2, rtol=1e-15)
    np.testing.assert_array_equal(dx, f(0.1))
    np.testing.assert_array_equal(dx2, f(0.7))
    layer, bottom, top = build('name: "r" type: "Reduction" reduction_param { operation: MEAN '
                               'coeff: 0.3 }', [x])
    (y,), (dx,) = fwd_bwd(layer, bottom, top, [1.0])
    np.testing.assert_allclose(y, f(0.3) / 6 * x.sum(), rtol=1e-15)
    np.testing.assert_allclose(dx, f(0.3) / 6, rtol=1e-15)
    # a threshold of float32(0.3) = 0.30000001192...: 0.3000000119 is not above it
    xx = np.array([0.3, 0.3000000119, 0.30000002])
    layer, bottom, top = build('name: "t" type: "Threshold" threshold_param { threshold: 0.3 }',
                               [xx])
    layer.forward(bottom, top)
    np.testing.assert_array_equal(to_numpy(top[0].data), [0.0, 0.0, 1.0])
