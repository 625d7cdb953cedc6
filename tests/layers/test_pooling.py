"""Pooling: Caffe's rounding and padding rules against torch and hand-computed
cases, MAX masks, gradient checks for every method, declarations, errors, GPU."""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layers.pooling import FLT_MAX, pooled_size
from minicaffe.proto import caffe_pb2
from minicaffe.testing.gradient_check import check_gradient, make_blob, make_layer


def pool_text(body, name="pool"):
    return f'name: "{name}" type: "Pooling" pooling_param {{ {body} }}'


def run(layer, x, n_top=1, xp=np, dtype=np.float64):
    bottom = [make_blob(x, xp=xp, dtype=dtype, name="in")]
    top = [Blob(xp=xp, dtype=dtype, name=f"out{i}") for i in range(n_top)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return bottom, top


def distinct(rng, shape):
    """Values without ties, at least 0.01 apart: the max is stable under the
    numerical-gradient step."""
    n = int(np.prod(shape))
    return (rng.permutation(n).reshape(shape) - n / 2) * 0.01


# (prototxt body, torch kwargs, input shape); torch with ceil_mode=True and
# count_include_pad=True rounds and divides as Caffe does in these cases.
TORCH_CASES = {
    "k3s2": ("kernel_size: 3 stride: 2", dict(kernel_size=3, stride=2), (2, 3, 7, 7)),
    "k3s2_ceil": ("kernel_size: 3 stride: 2", dict(kernel_size=3, stride=2), (2, 2, 8, 6)),
    "k3s2p1": ("kernel_size: 3 stride: 2 pad: 1", dict(kernel_size=3, stride=2, padding=1),
               (2, 2, 8, 7)),
    "k2s2p1_clip": ("kernel_size: 2 stride: 2 pad: 1", dict(kernel_size=2, stride=2, padding=1),
                    (1, 2, 3, 5)),
    "rect": ("kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0",
             dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0)), (2, 2, 7, 6)),
    "overlap_s1": ("kernel_size: 3 stride: 1 pad: 1", dict(kernel_size=3, stride=1, padding=1),
                   (1, 2, 5, 4)),
    "default_stride": ("kernel_size: 2", dict(kernel_size=2, stride=1), (1, 2, 4, 5)),
}


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("case", sorted(TORCH_CASES))
def test_forward_matches_torch_ceil_mode(method, case, rng):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    body, kwargs, shape = TORCH_CASES[case]
    x = rng.standard_normal(shape)
    layer = make_layer(pool_text(f"pool: {method} {body}"))
    _, (top,) = run(layer, x)
    tx = torch.tensor(x)
    if method == "MAX":
        ref = F.max_pool2d(tx, ceil_mode=True, **kwargs)
    else:
        ref = F.avg_pool2d(tx, ceil_mode=True, count_include_pad=True, **kwargs)
    assert top.shape == tuple(ref.shape)
    np.testing.assert_allclose(top.data, ref.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_floor_round_mode_matches_torch(method, rng):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = rng.standard_normal((2, 2, 8, 6))
    layer = make_layer(pool_text(f"pool: {method} kernel_size: 3 stride: 2 round_mode: FLOOR"))
    _, (top,) = run(layer, x)
    tx = torch.tensor(x)
    ref = (F.max_pool2d(tx, 3, 2) if method == "MAX" else F.avg_pool2d(tx, 3, 2)).numpy()
    assert top.shape == ref.shape == (2, 2, 3, 2)
    np.testing.assert_allclose(top.data, ref, rtol=1e-12)


def test_max_mask_top_matches_torch_indices(rng):
    torch = pytest.importorskip("torch")
    x = distinct(rng, (2, 3, 7, 6))
    layer = make_layer(pool_text("pool: MAX kernel_size: 3 stride: 2 pad: 1"))
    _, (top, mask) = run(layer, x, n_top=2)
    ref, idx = torch.nn.functional.max_pool2d(torch.tensor(x), 3, 2, 1, ceil_mode=True,
                                              return_indices=True)
    np.testing.assert_array_equal(top.data, ref.numpy())
    np.testing.assert_array_equal(mask.data, idx.numpy().astype(np.float64))
    assert "mask" not in layer.internals


def test_backward_matches_torch_autograd(rng):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = distinct(rng, (2, 2, 7, 6))
    for method in ("MAX", "AVE"):
        layer = make_layer(pool_text(f"pool: {method} kernel_size: 3 stride: 2 pad: 1"))
        (bottom,), (top,) = run(layer, x)
        dy = rng.standard_normal(top.shape)
        top.diff[...] = dy
        layer.backward([top], [True], [bottom])
        tx = torch.tensor(x, requires_grad=True)
        if method == "MAX":
            out = F.max_pool2d(tx, 3, 2, 1, ceil_mode=True)
        else:
            out = F.avg_pool2d(tx, 3, 2, 1, ceil_mode=True, count_include_pad=True)
        out.backward(torch.tensor(dy))
        np.testing.assert_allclose(bottom.diff, tx.grad.numpy(), rtol=1e-12, atol=1e-14)


# --------------------------------------------------- hand-computed Caffe cases
def test_pooled_size_rules():
    assert pooled_size(7, 3, 0, 2) == 3
    assert pooled_size(8, 3, 0, 2) == 4          # ceil: a window overhangs
    assert pooled_size(8, 3, 0, 2, round_mode=1) == 3
    assert pooled_size(3, 2, 1, 2) == 2          # ceil gives 3; the last starts in the padding
    assert pooled_size(4, 1, 0, 2) == 3          # no padding, no clipping (Caffe)
    assert pooled_size(4, 1, 0, 2, clip=True) == 2


def test_ave_padding_counts_overhang_does_not():
    # 3x3 ones, kernel 2, stride 2, pad 1: ceil gives 3 windows, the last would
    # start at row 3, in the padding ((3-1)*2 >= H + pad), and is dropped; windows
    # [-1, 1) and [1, 3) both divide by 2 per axis, padding pixels count as 0.
    layer = make_layer(pool_text("pool: AVE kernel_size: 2 stride: 2 pad: 1"))
    _, (top,) = run(layer, np.ones((1, 1, 3, 3)))
    np.testing.assert_allclose(top.data[0, 0], [[1 / 4, 2 / 4], [2 / 4, 4 / 4]])
    # 4x4 ones, kernel 3, stride 2, pad 1: windows [-1, 2), [1, 4), [3, 6); the
    # last overhangs the padded extent [-1, 5) and is clipped to [3, 5): its
    # divisor is 2 per axis (one image row, one padding row), not 3.
    layer = make_layer(pool_text("pool: AVE kernel_size: 3 stride: 2 pad: 1"))
    _, (top,) = run(layer, np.ones((1, 1, 4, 4)))
    rows = np.array([2 / 3, 3 / 3, 1 / 2])  # image rows / clipped window rows
    np.testing.assert_allclose(top.data[0, 0], np.outer(rows, rows))


def test_empty_last_window_without_padding_differs_from_torch(rng):
    """k=1, s=2 on 4 pixels: Caffe's ceil makes 3 windows and, with no padding,
    keeps the third, which starts past the image (torch drops it).  MAX gives
    -FLT_MAX with mask -1 there and no gradient; AVE divides 0 by 0."""
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((1, 1, 4, 4))
    layer = make_layer(pool_text("pool: MAX kernel_size: 1 stride: 2"))
    (bottom,), (top, mask) = run(layer, x, n_top=2)
    assert top.shape == (1, 1, 3, 3)
    ref = torch.nn.functional.max_pool2d(torch.tensor(x), 1, 2, ceil_mode=True).numpy()
    assert ref.shape == (1, 1, 2, 2)
    np.testing.assert_array_equal(top.data[:, :, :2, :2], ref)
    assert (top.data[0, 0, 2, :] == -FLT_MAX).all() and (top.data[0, 0, :, 2] == -FLT_MAX).all()
    assert (mask.data[0, 0, 2, :] == -1).all()
    top.diff[...] = 1.0
    layer.backward([top, mask], [True], [bottom])
    expected = np.zeros((4, 4))
    expected[::2, ::2] = 1.0
    np.testing.assert_array_equal(bottom.diff[0, 0], expected)

    layer = make_layer(pool_text("pool: AVE kernel_size: 1 stride: 2"))
    (bottom,), (top,) = run(layer, x)
    np.testing.assert_array_equal(top.data[0, 0, :2, :2], x[0, 0, ::2, ::2])
    assert np.isnan(top.data[0, 0, 2, :]).all()
    top.diff[...] = 1.0
    layer.backward([top], [True], [bottom])
    np.testing.assert_array_equal(bottom.diff[0, 0], expected)


def test_pad_on_one_axis_clips_both():
    # Caffe checks the last window of both axes as soon as either is padded:
    # H=4, k=1, s=2, pad_h=0 gives 2 rows (3 without any padding).
    layer = make_layer(pool_text("pool: MAX kernel_h: 1 kernel_w: 2 stride: 2 pad_h: 0 pad_w: 1"))
    _, (top,) = run(layer, np.zeros((1, 1, 4, 4)))
    assert top.shape == (1, 1, 2, 3)


def test_max_routes_gradient_to_first_maximum():
    # all-equal window: the first pixel in row-major order wins
    x = np.zeros((1, 1, 2, 3))
    x[0, 0] = [[1.0, 2.0, 2.0], [2.0, 0.0, 2.0]]
    layer = make_layer(pool_text("pool: MAX kernel_size: 2 stride: 1"))
    (bottom,), (top,) = run(layer, x)
    np.testing.assert_array_equal(top.data[0, 0], [[2.0, 2.0]])
    np.testing.assert_array_equal(layer.internal("mask").data[0, 0], [[1, 1]])
    top.diff[...] = [[[[3.0, 5.0]]]]
    bottom.diff[...] = 7.0  # overwritten
    layer.backward([top], [True], [bottom])
    np.testing.assert_array_equal(bottom.diff[0, 0], [[0.0, 8.0, 0.0], [0.0, 0.0, 0.0]])


def test_max_ignores_values_at_or_below_minus_flt_max():
    x = np.full((1, 1, 2, 2), -np.inf)
    x[0, 0, 1, 1] = -FLT_MAX
    layer = make_layer(pool_text("pool: MAX kernel_size: 2"))
    _, (top,) = run(layer, x)
    assert top.data[0, 0, 0, 0] == -FLT_MAX
    assert layer.internal("mask").data[0, 0, 0, 0] == -1


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_global_pooling(method, rng):
    x = rng.standard_normal((2, 3, 5, 4))
    layer = make_layer(pool_text(f"pool: {method} global_pooling: true"))
    (bottom,), (top,) = run(layer, x)
    assert top.shape == (2, 3, 1, 1)
    ref = x.max(axis=(2, 3)) if method == "MAX" else x.mean(axis=(2, 3))
    np.testing.assert_allclose(top.data[:, :, 0, 0], ref, rtol=1e-12)
    # the kernel follows the bottom's shape
    bottom.reshape(2, 3, 6, 6)
    layer.reshape([bottom], [top])
    assert layer.kernel == (6, 6) and top.shape == (2, 3, 1, 1)


# ---------------------------------------------------------------- gradients
GRAD_CASES = [
    "pool: MAX kernel_size: 3 stride: 2",
    "pool: MAX kernel_size: 3 stride: 2 pad: 1",
    "pool: MAX kernel_h: 3 kernel_w: 2 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 1",
    "pool: MAX kernel_size: 2 stride: 3",
    "pool: MAX global_pooling: true",
    "pool: MAX kernel_size: 3 stride: 2 round_mode: FLOOR",
    "pool: AVE kernel_size: 3 stride: 2",
    "pool: AVE kernel_size: 3 stride: 2 pad: 1",
    "pool: AVE kernel_size: 3 stride: 1 pad: 2",
    "pool: AVE kernel_h: 2 kernel_w: 3 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 2",
    "pool: AVE kernel_size: 2 stride: 2",
    "pool: AVE kernel_size: 2 stride: 3 pad: 1",
    "pool: AVE global_pooling: true",
]


@pytest.mark.parametrize("body", GRAD_CASES)
def test_gradient(body, rng):
    layer = make_layer(pool_text(body))
    # 7x5: no configuration above leaves a window without pixels
    check_gradient(layer, [make_blob(distinct(rng, (2, 2, 7, 5)))])


def test_gradient_with_mask_top(rng):
    layer = make_layer(pool_text("pool: MAX kernel_size: 3 stride: 2 pad: 1"))
    top = [Blob(dtype=np.float64), Blob(dtype=np.float64)]
    check_gradient(layer, [make_blob(distinct(rng, (2, 2, 6, 5)))], top=top)
    assert layer.backward_reads().top == (1,)


# ------------------------------------------------------------------ STOCHASTIC
def test_stochastic_train_samples_window_values(rng):
    x = rng.uniform(0.1, 1.0, (2, 3, 6, 5))
    layer = make_layer(pool_text("pool: STOCHASTIC kernel_size: 3 stride: 2"))
    _, (top,) = run(layer, x)
    assert top.shape == (2, 3, 3, 2)
    idx = layer.internal("rand_idx").data.astype(int)
    plane = x.reshape(2, 3, -1)
    picked = np.take_along_axis(plane, idx.reshape(2, 3, -1), axis=2).reshape(top.shape)
    np.testing.assert_array_equal(top.data, picked)
    # each sampled pixel lies in its window
    hs = np.arange(3)[:, None] * 2
    ws = np.arange(2)[None, :] * 2
    h, w = idx // 5, idx % 5
    assert ((h >= hs) & (h < hs + 3) & (w >= ws) & (w < ws + 3)).all()


def test_stochastic_train_frequencies():
    # one window [1, 3]: the 3 is drawn with probability 3/4
    x = np.tile(np.array([1.0, 3.0]).reshape(1, 1, 1, 2), (4000, 1, 1, 1))
    layer = make_layer(pool_text("pool: STOCHASTIC kernel_h: 1 kernel_w: 2"))
    _, (top,) = run(layer, x)
    assert abs((top.data == 3.0).mean() - 0.75) < 0.03


def test_stochastic_test_phase_is_weighted_average():
    x = np.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 1, 2, 2)
    layer = make_layer(pool_text("pool: STOCHASTIC kernel_size: 2"), phase=caffe_pb2.TEST)
    (bottom,), (top,) = run(layer, x)
    assert top.data[0, 0, 0, 0] == pytest.approx(30.0 / 10.0)
    top.diff[...] = 1
    with pytest.raises(RuntimeError, match="TEST phase"):
        layer.backward([top], [True], [bottom])


def test_stochastic_gradient(rng):
    layer = make_layer(pool_text("pool: STOCHASTIC kernel_size: 3 stride: 2"))
    check_gradient(layer, [make_blob(rng.uniform(0.5, 1.0, (2, 2, 6, 5)))])
    assert layer.backward_reads().internals == ("rand_idx",)


# ------------------------------------------------------------- declarations
def test_backward_reads_and_internals(rng):
    x = rng.standard_normal((2, 2, 5, 5))
    layer = make_layer(pool_text("pool: MAX kernel_size: 2 stride: 2"))
    run(layer, x)
    reads = layer.backward_reads()
    assert reads.bottom == () and reads.top == () and reads.internals == ("mask",)
    mask = layer.internals["mask"]
    assert mask.saved and mask.blob.dtype == np.int32 and mask.blob.shape == (2, 2, 3, 3)
    layer = make_layer(pool_text("pool: AVE kernel_size: 2 stride: 2"))
    run(layer, x)
    reads = layer.backward_reads()
    assert reads.bottom == () and reads.top == () and reads.internals == ()
    assert not layer.internals


def test_bottom_diff_untouched_without_propagate_down(rng):
    layer = make_layer(pool_text("pool: AVE kernel_size: 2"))
    (bottom,), (top,) = run(layer, rng.standard_normal((1, 1, 3, 3)))
    bottom.diff[...] = 5
    layer.backward([top], [False], [bottom])
    assert (bottom.diff == 5).all()


def test_flops(rng):
    layer = make_layer(pool_text("pool: MAX kernel_size: 3 stride: 2"))
    bottom, top = run(layer, np.zeros((2, 3, 7, 7)))
    assert layer.flops(bottom, top) == (2 * 3 * 9 * 9.0, 2 * 3 * 9 * 9.0)


# -------------------------------------------------------------------- errors
@pytest.mark.parametrize("body,n_top,shape,message", [
    ("pool: MAX", 1, (1, 1, 4, 4), "filter size must be given"),
    ("pool: MAX kernel_size: 2 kernel_h: 2 kernel_w: 2", 1, (1, 1, 4, 4), "not both"),
    ("pool: MAX kernel_h: 2", 1, (1, 1, 4, 4), "both kernel_h and kernel_w are required"),
    ("pool: MAX kernel_size: 2 pad: 1 pad_h: 1 pad_w: 1", 1, (1, 1, 4, 4), "pad is pad OR"),
    ("pool: MAX kernel_size: 2 pad_h: 1", 1, (1, 1, 4, 4), "pad is pad OR"),
    ("pool: MAX kernel_size: 2 stride_w: 1", 1, (1, 1, 4, 4), "stride is stride OR"),
    ("pool: MAX kernel_size: 0", 1, (1, 1, 4, 4), "cannot be zero"),
    ("pool: MAX kernel_size: 2 stride: 0", 1, (1, 1, 4, 4), "stride"),
    ("pool: MAX kernel_size: 2 pad: 2", 1, (1, 1, 4, 4), "smaller than the kernel"),
    ("pool: STOCHASTIC kernel_size: 2 pad: 1", 1, (1, 1, 4, 4), "only for average and max"),
    ("pool: MAX global_pooling: true kernel_size: 2", 1, (1, 1, 4, 4), "cannot be specified"),
    ("pool: AVE global_pooling: true stride: 2", 1, (1, 1, 4, 4), "only pad = 0 and stride = 1"),
    ("pool: AVE kernel_size: 2", 2, (1, 1, 4, 4), "only MAX pooling has a second top"),
    ("pool: MAX kernel_size: 2", 1, (1, 4, 4), "must have 4 axes"),
    ("pool: MAX kernel_size: 5", 1, (1, 1, 3, 3), "does not fit"),
])
def test_bad_params_raise_clear_errors(body, n_top, shape, message):
    layer = make_layer(pool_text(body, name="badpool"))
    with pytest.raises(ValueError, match=message) as err:
        run(layer, np.zeros(shape), n_top=n_top)
    assert "'badpool'" in str(err.value)


def test_three_tops_rejected():
    layer = make_layer(pool_text("pool: MAX kernel_size: 2"))
    with pytest.raises(ValueError, match="at most 2"):
        run(layer, np.zeros((1, 1, 4, 4)), n_top=3)


# ----------------------------------------------------------------------- GPU
GPU_CASES = [
    ("pool: MAX kernel_size: 3 stride: 2", 1),
    ("pool: MAX kernel_size: 3 stride: 2 pad: 1", 1),
    ("pool: MAX kernel_size: 3 stride: 2 pad: 1", 2),
    ("pool: MAX kernel_h: 3 kernel_w: 2 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 1", 2),
    ("pool: MAX kernel_size: 1 stride: 2", 1),
    ("pool: MAX global_pooling: true", 1),
    ("pool: AVE kernel_size: 3 stride: 2 pad: 1", 1),
    ("pool: AVE kernel_size: 3 stride: 1 pad: 2", 1),
    ("pool: AVE kernel_h: 2 kernel_w: 3 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 2", 1),
    ("pool: AVE global_pooling: true", 1),
    ("pool: AVE kernel_size: 2 stride: 2 round_mode: FLOOR", 1),
]


@pytest.mark.gpu
@pytest.mark.parametrize("body,n_top", GPU_CASES)
def test_gpu_matches_numpy(cp, body, n_top, rng):
    x = distinct(rng, (4, 3, 9, 8)).astype(np.float32)
    cpu = make_layer(pool_text(body))
    gpu = make_layer(pool_text(body), xp=cp, dtype=np.float32)
    (cb,), ct = run(cpu, x, n_top=n_top)
    (gb,), gt = run(gpu, x, n_top=n_top, xp=cp, dtype=np.float32)
    dy = rng.standard_normal(ct[0].shape).astype(np.float32)
    ct[0].diff[...] = dy
    gt[0].diff[...] = cp.asarray(dy)
    cpu.backward(ct, [True], [cb])
    gpu.backward(gt, [True], [gb])
    mask_cpu = ct[1].data if n_top == 2 else cpu.internal("mask").data if "MAX" in body else None
    if mask_cpu is not None:
        mask_gpu = gt[1].data if n_top == 2 else gpu.internal("mask").data
        np.testing.assert_array_equal(to_numpy(mask_gpu), mask_cpu)
    for g, c in ((gt[0].data, ct[0].data), (gb.diff, cb.diff)):
        g = to_numpy(g)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(c))
        ok = ~np.isnan(c)
        assert np.abs(g[ok] - c[ok]).max() <= 1e-5 * max(np.abs(c[ok]).max(), 1e-30)


@pytest.mark.gpu
def test_gpu_stochastic_runs_generic_path(cp, rng):
    x = rng.uniform(0.1, 1.0, (2, 3, 6, 5)).astype(np.float32)
    layer = make_layer(pool_text("pool: STOCHASTIC kernel_size: 3 stride: 2"), xp=cp,
                       dtype=np.float32)
    (bottom,), (top,) = run(layer, x, xp=cp, dtype=np.float32)
    idx = to_numpy(layer.internal("rand_idx").data).astype(int)
    picked = np.take_along_axis(x.reshape(2, 3, -1), idx.reshape(2, 3, -1), axis=2)
    np.testing.assert_array_equal(to_numpy(top.data), picked.reshape(top.shape))
    top.diff[...] = 1
    layer.backward([top], [True], [bottom])
    assert float(bottom.diff.sum()) == pytest.approx(top.count)
