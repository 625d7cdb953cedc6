"""Deconvolution: forward and backward against torch's conv_transpose2d and hand-computed
values, gradient checks for every configuration, Caffe's shapes and diff semantics,
declarations, engines, errors, caffemodel weights, an FCN head in a Net, GPU."""
import numpy as np
import pytest

from minicaffe import engine as engines
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layers.conv import ConvolutionLayer
from minicaffe.layers.deconv import DeconvolutionLayer, deconv_out_size
from minicaffe.net import TEST, TRAIN, Net
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.rng import set_random_seed
from minicaffe.testing.gradient_check import check_gradient, make_blob, make_layer


def deconv_text(body, fillers=True, name="deconv"):
    if fillers:
        body += ' weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" }'
    return f'name: "{name}" type: "Deconvolution" convolution_param {{ {body} }}'


def run(layer, *xs, xp=np, dtype=np.float64):
    bottom = [make_blob(x, xp=xp, dtype=dtype, name=f"in{i}") for i, x in enumerate(xs)]
    top = [Blob(xp=xp, dtype=dtype, name=f"out{i}") for i in range(len(xs))]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return bottom, top


# name: (prototxt body, torch conv_transpose2d kwargs, input shape)
CASES = {
    "basic": ("num_output: 4 kernel_size: 3", dict(), (2, 3, 4, 3)),
    "pad_stride": ("num_output: 3 kernel_size: 3 pad: 1 stride: 2",
                   dict(stride=2, padding=1), (2, 2, 4, 3)),
    "fcn_upscore": ("num_output: 3 kernel_size: 4 stride: 2", dict(stride=2), (2, 3, 3, 4)),
    "rect_hw_fields": ("num_output: 3 kernel_h: 3 kernel_w: 2 pad_h: 1 pad_w: 0 stride_h: 2 "
                       "stride_w: 1", dict(stride=(2, 1), padding=(1, 0)), (2, 2, 3, 4)),
    "rect_repeated": ("num_output: 2 kernel_size: 2 kernel_size: 3 pad: 0 pad: 1 stride: 1 "
                      "stride: 2", dict(stride=(1, 2), padding=(0, 1)), (1, 3, 3, 4)),
    "groups": ("num_output: 4 kernel_size: 3 pad: 1 group: 2", dict(padding=1, groups=2),
               (2, 4, 4, 4)),
    "depthwise_bilinear_like": ("num_output: 3 kernel_size: 4 stride: 2 pad: 1 group: 3",
                                dict(stride=2, padding=1, groups=3), (2, 3, 3, 3)),
    "dilation": ("num_output: 3 kernel_size: 3 dilation: 2 pad: 1", dict(dilation=2, padding=1),
                 (2, 2, 3, 4)),
    "dilation_rect": ("num_output: 2 kernel_size: 2 dilation: 3 dilation: 1 pad_h: 1 pad_w: 0",
                      dict(dilation=(3, 1), padding=(1, 0)), (1, 2, 3, 4)),
    "one_by_one": ("num_output: 5 kernel_size: 1", dict(), (2, 3, 4, 3)),
    "one_by_one_groups": ("num_output: 4 kernel_size: 1 group: 2", dict(groups=2), (3, 4, 3, 2)),
    "one_by_one_strided": ("num_output: 2 kernel_size: 1 stride: 2", dict(stride=2),
                           (2, 3, 3, 2)),
    "no_bias": ("num_output: 3 kernel_size: 2 bias_term: false stride: 2", dict(stride=2),
                (2, 2, 3, 4)),
    "groups_dilation_stride": ("num_output: 6 kernel_h: 2 kernel_w: 3 group: 3 dilation: 2 "
                               "stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 1",
                               dict(groups=3, dilation=2, stride=(1, 2), padding=(1, 1)),
                               (2, 3, 3, 3)),
}


def _torch_ref(torch, layer, x, kwargs, dy=None):
    """torch's conv_transpose2d with the layer's weights (Caffe's (C, M/G, kh, kw) is
    torch's weight layout): the output, and with ``dy`` the gradients."""
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(to_numpy(layer.blobs[0].data), requires_grad=True)
    tb = (torch.tensor(to_numpy(layer.blobs[1].data), requires_grad=True) if layer.bias_term
          else None)
    y = torch.nn.functional.conv_transpose2d(tx, tw, tb, **kwargs)
    if dy is None:
        return y.detach().numpy()
    y.backward(torch.tensor(dy))
    return tx.grad.numpy(), tw.grad.numpy(), None if tb is None else tb.grad.numpy()


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_matches_torch(case, rng):
    torch = pytest.importorskip("torch")
    body, kwargs, shape = CASES[case]
    layer = make_layer(deconv_text(body))
    x = rng.standard_normal(shape)
    _, (top,) = run(layer, x)
    ref = _torch_ref(torch, layer, x, kwargs)
    assert top.shape == ref.shape
    np.testing.assert_allclose(top.data, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", ["pad_stride", "groups_dilation_stride", "one_by_one_groups",
                                  "no_bias", "fcn_upscore"])
def test_backward_matches_torch_autograd(case, rng):
    torch = pytest.importorskip("torch")
    body, kwargs, shape = CASES[case]
    layer = make_layer(deconv_text(body))
    x = rng.standard_normal(shape)
    (bottom,), (top,) = run(layer, x)
    dy = rng.standard_normal(top.shape)
    top.diff[...] = dy
    for p in layer.blobs:
        p.diff[...] = 0
    layer.backward([top], [True], [bottom])
    dx, dw, db = _torch_ref(torch, layer, x, kwargs, dy)
    np.testing.assert_allclose(bottom.diff, dx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(layer.blobs[0].diff, dw, rtol=1e-10, atol=1e-12)
    if db is not None:
        np.testing.assert_allclose(layer.blobs[1].diff, db, rtol=1e-10, atol=1e-12)


def test_hand_computed_values():
    # stride = kernel = 2: every input pixel stamps the kernel, scaled, on its own 2x2 tile
    # (the top is the Kronecker product of the image and the kernel), plus the bias
    layer = make_layer(deconv_text("num_output: 1 kernel_size: 2 stride: 2", fillers=False))
    x = np.array([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 1, 2, 2)
    k = np.array([[1.0, 10.0], [100.0, 1000.0]])
    bottom, top = [make_blob(x)], [Blob(dtype=np.float64)]
    layer.setup(bottom, top)
    layer.blobs[0].data[...] = k.reshape(1, 1, 2, 2)
    layer.blobs[1].data[...] = 0.5
    layer.forward(bottom, top)
    stamped = np.kron(x[0, 0], k)
    np.testing.assert_array_equal(top[0].data[0, 0], stamped + 0.5)
    # pad 1 removes one pixel of every border of that output
    layer = make_layer(deconv_text("num_output: 1 kernel_size: 2 stride: 2 pad: 1 "
                                   "bias_term: false", fillers=False))
    top = [Blob(dtype=np.float64)]
    layer.setup(bottom, top)
    layer.blobs[0].data[...] = k.reshape(1, 1, 2, 2)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data[0, 0], stamped[1:3, 1:3])
    # stride 1: overlapping stamps add up
    layer = make_layer(deconv_text("num_output: 1 kernel_size: 2 bias_term: false",
                                   fillers=False))
    top = [Blob(dtype=np.float64)]
    layer.setup([make_blob(np.ones((1, 1, 1, 2)))], top)
    layer.blobs[0].data[...] = k.reshape(1, 1, 2, 2)
    layer.forward([make_blob(np.ones((1, 1, 1, 2)))], top)
    np.testing.assert_array_equal(top[0].data[0, 0], [[1, 11, 10], [100, 1100, 1000]])


def test_caffe_output_size_and_param_shapes():
    assert deconv_out_size(16, 64, 0, 32) == 544          # FCN-32s upscore on a 16x16 map
    assert deconv_out_size(5, 3, 1, 2, dilation=2) == 11  # 2*4 + 2*2 + 1 - 2
    # FCN-8s's upscore2: 21 classes, bilinear weights per class (group 21), no bias
    layer = make_layer(deconv_text('num_output: 21 kernel_size: 4 stride: 2 group: 21 '
                                   'bias_term: false weight_filler { type: "bilinear" }',
                                   fillers=False))
    bottom, top = [make_blob(np.zeros((1, 21, 10, 10)))], [Blob(dtype=np.float64)]
    layer.setup(bottom, top)   # set up only: shapes and parameters
    assert top[0].shape == (1, 21, 22, 22)
    assert [b.shape for b in layer.blobs] == [(21, 1, 4, 4)]
    f = np.array([0.25, 0.75, 0.75, 0.25])
    np.testing.assert_allclose(layer.blobs[0].data[3, 0], np.outer(f, f))
    # the weight is (C_in, C_out/G, kh, kw), the bias (C_out,)
    layer = make_layer(deconv_text("num_output: 6 kernel_h: 3 kernel_w: 5 group: 2"))
    bottom, top = [make_blob(np.zeros((1, 4, 3, 2)))], [Blob(dtype=np.float64)]
    layer.setup(bottom, top)
    assert [b.shape for b in layer.blobs] == [(4, 3, 3, 5), (6,)]
    assert top[0].shape == (1, 6, 5, 6)
    assert layer.bottom_channels == 4 and layer.top_channels == 6
    assert isinstance(layer, DeconvolutionLayer) and layer.type == "Deconvolution"


def test_weight_filler_fan_in_is_caffes():
    # Caffe's fillers take fan_in = count / shape[0] = M/G*kh*kw of the (C, M/G, kh, kw) weight
    set_random_seed(4)
    layer = make_layer(deconv_text('num_output: 8 kernel_size: 3 weight_filler '
                                   '{ type: "xavier" }', fillers=False))
    layer.setup([make_blob(np.zeros((1, 2, 3, 3)))], [Blob(dtype=np.float64)])
    w = layer.blobs[0].data
    bound = np.sqrt(3.0 / (8 * 9))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
    assert not layer.blobs[1].data.any()   # the default constant 0 filler


# ------------------------------------------------------------- gradients
@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient(case, rng):
    body, _, shape = CASES[case]
    layer = make_layer(deconv_text(body))
    check_gradient(layer, [make_blob(rng.standard_normal(shape))])


def test_gradient_two_bottoms_share_weights(rng):
    layer = make_layer(deconv_text("num_output: 2 kernel_size: 3 pad: 1 stride: 2"))
    xs = [rng.standard_normal((2, 2, 3, 3)) for _ in range(2)]
    check_gradient(layer, [make_blob(x) for x in xs],
                   top=[Blob(dtype=np.float64), Blob(dtype=np.float64)])


def test_gradient_axis_two(rng):
    # bottom (A, B, C, H, W) with axis 2: A*B independent images
    layer = make_layer(deconv_text("num_output: 2 kernel_size: 2 stride: 2 axis: 2"))
    top = check_gradient(layer, [make_blob(rng.standard_normal((2, 2, 3, 2, 3)))])
    assert layer.blobs[0].shape == (3, 2, 2, 2)
    assert top[0].shape == (2, 2, 2, 4, 6)


@pytest.mark.parametrize("case", ["pad_stride", "groups", "one_by_one"])
def test_gradient_with_one_image_chunks(case, rng, monkeypatch):
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", 0)
    body, _, shape = CASES[case]
    layer = make_layer(deconv_text(body))
    check_gradient(layer, [make_blob(rng.standard_normal((3,) + shape[1:]))])
    assert layer.chunk == (3 if layer.is_1x1 else 1)
    if not layer.is_1x1:
        # Caffe's one-image buffer: (M*kh*kw, H*W) of the convolution it transposes
        assert layer.internal("col").shape == (1, layer.top_channels * 9, shape[2] * shape[3])
        assert "top_diff_t" not in layer.internals


def test_gradient_without_param_or_bottom_diffs(rng):
    layer = make_layer(deconv_text("num_output: 2 kernel_size: 3 stride: 2"))
    check_gradient(layer, [make_blob(rng.standard_normal((2, 2, 3, 3)))], check_params=[])
    layer = make_layer(deconv_text("num_output: 2 kernel_size: 3 stride: 2"))
    check_gradient(layer, [make_blob(rng.standard_normal((2, 2, 3, 3)))], check_bottom=[])


def test_chunked_equals_whole_batch(rng, monkeypatch):
    x = rng.standard_normal((5, 4, 4, 4))
    dy = rng.standard_normal((5, 3, 9, 9))
    results = []
    per_image = 3 * 9 * 16 * 8  # M*kh*kw x H*W float64
    for limit in (1 << 30, 0, 2 * per_image):  # whole batch, one image, two images
        monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", limit)
        set_random_seed(3)
        layer = make_layer(deconv_text("num_output: 3 kernel_size: 3 stride: 2"))
        (bottom,), (top,) = run(layer, x)
        top.diff[...] = dy
        layer.backward([top], [True], [bottom])
        results.append((layer.chunk, top.data.copy(), bottom.diff.copy(),
                        layer.blobs[0].diff.copy(), layer.blobs[1].diff.copy()))
    assert [r[0] for r in results] == [5, 1, 2]
    for r in results[1:]:
        for a, b in zip(r[1:], results[0][1:]):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------ diff semantics
def test_param_diffs_accumulate_bottom_diff_overwritten(rng):
    layer = make_layer(deconv_text("num_output: 2 kernel_size: 3 stride: 2 pad: 1"))
    (bottom,), (top,) = run(layer, rng.standard_normal((2, 2, 3, 3)))
    top.diff[...] = rng.standard_normal(top.shape)
    for p in layer.blobs:
        p.diff[...] = 0
    bottom.diff[...] = 1e6
    layer.backward([top], [True], [bottom])
    once = [p.diff.copy() for p in layer.blobs], bottom.diff.copy()
    assert np.abs(once[1]).max() < 1e5
    layer.backward([top], [True], [bottom])
    for p, d in zip(layer.blobs, once[0]):
        np.testing.assert_allclose(p.diff, 2 * d)
    np.testing.assert_allclose(bottom.diff, once[1])


def test_no_propagate_down_leaves_bottom_diff(rng):
    layer = make_layer(deconv_text("num_output: 2 kernel_size: 2 stride: 2"))
    (bottom,), (top,) = run(layer, rng.standard_normal((1, 2, 2, 2)))
    top.diff[...] = 1
    bottom.diff[...] = 3
    layer.param_propagate_down = [False, True]
    layer.blobs[0].diff[...] = 0
    layer.backward([top], [False], [bottom])
    assert (bottom.diff == 3).all()
    assert not layer.blobs[0].diff.any()
    np.testing.assert_allclose(layer.blobs[1].diff, [16.0, 16.0])  # 4x4 ones per channel


# -------------------------------------------------------- declarations
def test_backward_reads_and_internals(rng):
    layer = make_layer(deconv_text("num_output: 3 kernel_size: 3 stride: 2"))
    run(layer, rng.standard_normal((2, 2, 4, 5)))
    reads = layer.backward_reads()
    # the weight gradient reads the bottom data; nothing reads the top data
    assert reads.bottom == (0,) and reads.top == () and reads.internals == ()
    col = layer.internals["col"]
    assert not col.saved
    assert col.blob.shape == (2, 3 * 9, 4 * 5)      # (chunk, M*kh*kw, H*W)
    top_t = layer.internals["top_diff_t"]
    assert not top_t.saved and top_t.blob.shape == (2, 2 * 4 * 5)   # (C, chunk*H*W)
    assert "bias_sums" not in layer.internals
    layer.param_propagate_down = [False, True]
    assert layer.backward_reads().bottom == ()
    layer = make_layer(deconv_text("num_output: 2 kernel_size: 1"))
    run(layer, rng.standard_normal((2, 2, 5, 5)))
    assert "col" not in layer.internals


def test_flops():
    layer = make_layer(deconv_text("num_output: 4 kernel_size: 3 stride: 2 group: 2"))
    bottom, top = run(layer, np.zeros((2, 6, 5, 5)))
    fwd, bwd = layer.flops(bottom, top)
    # the multiply-adds of the convolution from the (2, 4, 11, 11) top to the bottom
    macs = 2 * 6 * (2 * 9) * 25
    assert fwd == 2 * macs + 2 * 4 * 11 * 11
    assert bwd == 2 * fwd


def test_explicit_cudnn_runs_the_caffe_engine(rng, monkeypatch):
    body = "num_output: 2 kernel_size: 3 stride: 2"
    x = rng.standard_normal((1, 2, 3, 3))
    set_random_seed(7)
    _, (ref,) = run(make_layer(deconv_text(body)), x)
    # CPU mode: an explicit CUDNN warns, naming the layer, and runs CAFFE
    engines.reset_warnings()
    set_random_seed(7)
    layer = make_layer(deconv_text(body + " engine: CUDNN"))
    with pytest.warns(engines.EngineWarning, match="'deconv'"):
        _, (top,) = run(layer, x)
    assert layer.engine == engines.CAFFE
    np.testing.assert_array_equal(top.data, ref.data)
    # where cuDNN would run (a GPU net), the layer falls back and says why
    monkeypatch.setattr(engines, "resolve", lambda layer, field: engines.CUDNN)
    layer = make_layer(deconv_text(body))
    run(layer, x)
    assert layer.engine == engines.CAFFE and "no cuDNN deconvolution" in layer.engine_fallback
    assert layer.workspace_model() is None and "workspace" not in layer.internals


def test_reshape_follows_bottom(rng):
    layer = make_layer(deconv_text("num_output: 2 kernel_size: 3 pad: 1 stride: 2"))
    bottom, top = run(layer, rng.standard_normal((2, 2, 3, 3)))
    bottom[0].reshape(3, 2, 4, 2)
    layer.reshape(bottom, top)
    assert top[0].shape == (3, 2, 7, 3)
    layer.forward(bottom, top)


# --------------------------------------------------------------- errors
@pytest.mark.parametrize("body,shape,message", [
    ("num_output: 2", (1, 2, 4, 4), "kernel_size"),
    ("num_output: 2 kernel_size: 3 kernel_h: 3 kernel_w: 3", (1, 2, 4, 4), "not both"),
    ("num_output: 2 kernel_size: 3 kernel_size: 3 kernel_size: 3", (1, 2, 4, 4),
     "once per spatial dimension"),
    ("num_output: 2 kernel_size: 0", (1, 2, 4, 4), "nonzero"),
    ("num_output: 2 kernel_size: 3 stride: 0", (1, 2, 4, 4), "nonzero"),
    ("num_output: 0 kernel_size: 3", (1, 2, 4, 4), "num_output"),
    ("num_output: 2 kernel_size: 3 group: 2", (1, 3, 4, 4), "multiple of group"),
    ("num_output: 3 kernel_size: 3 group: 2", (1, 2, 4, 4), "multiple of group"),
    ("num_output: 2 kernel_h: 3 kernel_w: 3", (1, 2, 4, 4, 4),
     "kernel_h & kernel_w can only be used for 2D convolution"),
    ("num_output: 2 kernel_size: 3 kernel_size: 3", (1, 2, 4, 4, 4),
     "once per spatial dimension"),
    ("num_output: 2 kernel_size: 1 pad: 1", (1, 2, 1, 4), "empty -1x2 output"),
])
def test_bad_params_raise_clear_errors(body, shape, message):
    layer = make_layer(deconv_text(body, fillers=False, name="bad"))
    with pytest.raises(ValueError, match=message) as err:
        run(layer, np.zeros(shape))
    assert "'bad' (Deconvolution)" in str(err.value)


def test_channel_change_is_an_error():
    layer = make_layer(deconv_text("num_output: 2 kernel_size: 3"))
    bottom, top = run(layer, np.zeros((1, 2, 4, 4)))
    bottom[0].reshape(1, 3, 4, 4)
    with pytest.raises(ValueError, match="incompatible with deconvolution kernel"):
        layer.reshape(bottom, top)


def test_bottoms_must_agree():
    layer = make_layer(deconv_text("num_output: 2 kernel_size: 3"))
    bottom = [make_blob(np.zeros((1, 2, 4, 4))), make_blob(np.zeros((1, 2, 5, 4)))]
    with pytest.raises(ValueError, match="shape mismatch"):
        layer.setup(bottom, [Blob(dtype=np.float64), Blob(dtype=np.float64)])


# ------------------------------------------------------- the cuBLAS branch
def _deconv_run(body, shape, calls=2):
    """Forward, then ``calls`` backward passes from zeroed param diffs (float64): copies
    of the top, the bottom diff and the param diffs."""
    r = np.random.default_rng(5)
    set_random_seed(5)
    layer = make_layer(deconv_text(body))
    bottom, top = run(layer, r.standard_normal(shape))
    top[0].diff[...] = r.standard_normal(top[0].shape)
    for p in layer.blobs:
        p.diff[...] = 0
    for _ in range(calls):
        layer.backward(top, [True], bottom)
    return [top[0].data.copy(), bottom[0].diff.copy()] + [p.diff.copy() for p in layer.blobs]


@pytest.mark.parametrize("case", ["basic", "groups", "fcn_upscore", "one_by_one_groups",
                                  "groups_dilation_stride", "depthwise_bilinear_like"])
@pytest.mark.parametrize("limit", [64 << 20, 0])
@pytest.mark.parametrize("batch", [1, 3])
def test_cublas_branch_computes_the_numpy_branch(case, limit, batch, monkeypatch):
    """The GPU's cuBLAS calls, run on the host (minicaffe.testing.cublas_host), give the
    NumPy path's numbers: whole-batch and one-image chunks, groups, 1x1, param diffs
    accumulating over two passes."""
    from minicaffe.testing.cublas_host import on_host
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", limit)
    body, _, shape = CASES[case]
    shape = (batch,) + shape[1:]
    ref = _deconv_run(body, shape)
    with on_host(monkeypatch) as calls:
        got = _deconv_run(body, shape)
    assert calls and set(calls) <= {"gemm", "gemm_strided_batched"}
    for g, c in zip(got, ref):
        np.testing.assert_allclose(g, c, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------- caffemodel
FCN_HEAD = """
name: "fcn_head"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 12 dim: 12 } shape { dim: 2 dim: 1 dim: 12 dim: 12 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 stride: 2 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "score" type: "Convolution" bottom: "conv1" top: "score"
        convolution_param { num_output: 3 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "upscore" type: "Deconvolution" bottom: "score" top: "upscore"
        convolution_param { num_output: 3 kernel_size: 6 stride: 2 group: GROUP
                            bias_term: BIAS weight_filler { type: "FILLER" std: 0.3 } } }
layer { name: "crop" type: "Crop" bottom: "upscore" bottom: "data" top: "crop"
        crop_param { axis: 2 offset: 1 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "crop" bottom: "label" top: "loss" }
"""


def fcn_param(group=1, bias=True, filler="gaussian"):
    text = (FCN_HEAD.replace("GROUP", str(group)).replace("BIAS", str(bias).lower())
            .replace("FILLER", filler))
    return parse_text(text, caffe_pb2.NetParameter, filename="<fcn head>")


def _fcn_inputs():
    r = np.random.default_rng(11)
    return r.standard_normal((2, 3, 12, 12)), r.integers(0, 3, (2, 1, 12, 12)).astype(float)


def test_caffemodel_weights_load_in_caffes_shapes(tmp_path):
    """A .caffemodel written as Caffe writes one (weight (C_in, C_out/G, kh, kw), then the
    bias; FCN's older files give the bias as a legacy (1, 1, 1, M) blob) loads into the
    layer, and a saved net reads back."""
    set_random_seed(2)
    net = Net(fcn_param(), TEST, dtype=np.float64)
    up = net.params["upscore"]
    assert [p.shape for p in up] == [(3, 3, 6, 6), (3,)]
    src = caffe_pb2.NetParameter()
    lp = src.layer.add(name="upscore", type="Deconvolution")
    w = np.arange(3 * 3 * 36, dtype=np.float32).reshape(3, 3, 6, 6) / 100
    wb = lp.blobs.add()
    wb.shape.dim.extend(w.shape)
    wb.data.extend(w.ravel().tolist())
    bb = lp.blobs.add()
    bb.num, bb.channels, bb.height, bb.width = 1, 1, 1, 3
    bb.data.extend([0.5, -1.0, 2.0])
    path = tmp_path / "fcn.caffemodel"
    path.write_bytes(src.SerializeToString())
    net.copy_from(str(path))
    np.testing.assert_array_equal(up[0].data, w)
    np.testing.assert_array_equal(up[1].data, [0.5, -1.0, 2.0])
    # round trip through Net.save: the same shapes in the file, the same numbers back
    x, label = _fcn_inputs()
    out = net.forward(data=x, label=label)
    net.save(str(tmp_path / "saved.caffemodel"))
    proto = caffe_pb2.NetParameter.FromString((tmp_path / "saved.caffemodel").read_bytes())
    saved = [lay for lay in proto.layer if lay.name == "upscore"][0]
    assert saved.type == "Deconvolution"
    assert [list(b.shape.dim) for b in saved.blobs] == [[3, 3, 6, 6], [3]]
    set_random_seed(9)
    again = Net(fcn_param(), TEST, weights=str(tmp_path / "saved.caffemodel"), dtype=np.float64)
    assert again.forward(data=x, label=label)["loss"] == pytest.approx(float(out["loss"]),
                                                                       rel=1e-6)


def test_caffemodel_with_the_convolution_shape_is_refused(tmp_path):
    net = Net(fcn_param(group=1), TEST, dtype=np.float64)
    src = caffe_pb2.NetParameter()
    lp = src.layer.add(name="upscore", type="Deconvolution")
    for shape in ((3, 1, 6, 6), (3,)):      # a group-3 weight for a group-1 layer
        b = lp.blobs.add()
        b.shape.dim.extend(shape)
        b.data.extend([0.0] * int(np.prod(shape)))
    path = tmp_path / "bad.caffemodel"
    path.write_bytes(src.SerializeToString())
    with pytest.raises(ValueError, match="upscore"):
        net.copy_from(str(path))


def test_v1_deconvolution_layer_is_upgraded():
    text = """
    name: "v1" input: "data" input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 3
    layers { name: "up" type: DECONVOLUTION bottom: "data" top: "up"
             convolution_param { num_output: 4 kernel_size: 4 stride: 2 } }
    """
    net = Net(parse_text(text, caffe_pb2.NetParameter), TEST)
    assert net.layers[-1].type == "Deconvolution"
    assert net.blobs["up"].shape == (1, 4, 8, 8)
    assert [p.shape for p in net.params["up"]] == [(2, 4, 4, 4), (4,)]


# --------------------------------------------------------- a Net (FCN head)
@pytest.mark.parametrize("group,bias", [(1, True), (3, False)])
def test_fcn_head_net_forward_backward(group, bias):
    """Convolution, 1x1 scores, a Deconvolution upsampling them past the image and a Crop
    back to it (bottom 1 is the data: only its shape is read), then a per-pixel softmax
    loss.  Net backward gives the numerical gradient of the loss for the deconvolution's
    parameters and the layers below it."""
    set_random_seed(5)
    net = Net(fcn_param(group, bias), TRAIN, dtype=np.float64)
    x, label = _fcn_inputs()
    net.blobs["data"].data[...] = x
    net.blobs["label"].data[...] = label
    li = net.layer_index
    assert net.blobs["upscore"].shape == (2, 3, 16, 16)        # (6-1)*2 + 6
    assert net.blobs["crop"].shape == (2, 3, 12, 12)
    assert net.bottom_need_backward[li("crop")] == [True, False]   # the data gets no diff
    assert not net.layer_need_backward[li("data")]
    net.clear_param_diffs()
    loss = float(net.forward_backward())
    assert np.isfinite(loss) and loss > 0
    np.testing.assert_array_equal(net.blobs["crop"].data,
                                  net.blobs["upscore"].data[:, :, 1:13, 1:13])
    # the upscore diff is the crop's diff inside the window, zero on its border
    d = net.blobs["upscore"].diff
    np.testing.assert_array_equal(d[:, :, 1:13, 1:13], net.blobs["crop"].diff)
    assert not d[:, :, 0].any() and not d[:, :, 13:].any() and not d[..., 0].any()

    def loss_at():
        return float(net.forward()["loss"])

    rng = np.random.default_rng(1)
    for name in ("upscore", "score", "conv1"):
        for p in net.params[name]:
            analytic = p.diff
            flat = p.data.reshape(-1)
            for i in rng.choice(flat.size, size=min(4, flat.size), replace=False):
                x0 = flat[i]
                flat[i] = x0 + 1e-6
                fp = loss_at()
                flat[i] = x0 - 1e-6
                fm = loss_at()
                flat[i] = x0
                num = (fp - fm) / 2e-6
                assert analytic.reshape(-1)[i] == pytest.approx(num, rel=1e-5, abs=1e-8), name


def test_fcn_head_with_bilinear_upsampling_interpolates():
    """FCN's fixed upsampling: a group-C deconvolution with bilinear weights, stride 2 and
    kernel 4, cropped by 1, doubles a constant map into the same constant (away from the
    border, where fewer stamps overlap)."""
    text = """
    name: "up"
    layer { name: "data" type: "Input" top: "data" top: "image"
            input_param { shape { dim: 1 dim: 2 dim: 5 dim: 5 } shape { dim: 1 dim: 3 dim: 10 dim: 10 } } }
    layer { name: "up" type: "Deconvolution" bottom: "data" top: "up"
            param { lr_mult: 0 }
            convolution_param { num_output: 2 kernel_size: 4 stride: 2 group: 2 bias_term: false
                                weight_filler { type: "bilinear" } } }
    layer { name: "crop" type: "Crop" bottom: "up" bottom: "image" top: "crop"
            crop_param { offset: 1 } }
    """
    net = Net(parse_text(text, caffe_pb2.NetParameter), TEST, dtype=np.float64)
    out = net.forward(data=np.full((1, 2, 5, 5), 3.0), image=np.zeros((1, 3, 10, 10)))
    crop = out["crop"]
    assert crop.shape == (1, 2, 10, 10)
    np.testing.assert_allclose(crop[:, :, 1:-1, 1:-1], 3.0)
    # a ramp along the width is upsampled to a finer ramp
    ramp = np.tile(np.arange(5.0), (1, 2, 5, 1))
    out = net.forward(data=ramp, image=np.zeros((1, 3, 10, 10)))
    np.testing.assert_allclose(out["crop"][0, 0, 4, 1:-1], (np.arange(1, 9) - 0.5) / 2)


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("case", ["basic", "pad_stride", "fcn_upscore", "rect_hw_fields",
                                  "groups", "dilation_rect", "one_by_one", "one_by_one_groups",
                                  "no_bias", "groups_dilation_stride",
                                  "depthwise_bilinear_like"])
@pytest.mark.parametrize("limit", [64 << 20, 0])
def test_gpu_matches_numpy(cp, case, limit, rng, monkeypatch):
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", limit)
    body, _, shape = CASES[case]
    shape = (5,) + shape[1:]
    x = rng.standard_normal(shape).astype(np.float32)
    cpu = make_layer(deconv_text(body))
    gpu = make_layer(deconv_text(body), xp=cp, dtype=np.float32)
    (cb,), (ct,) = run(cpu, x)
    gb = make_blob(x, xp=cp, dtype=np.float32)
    gt = Blob(xp=cp, dtype=np.float32)
    gpu.setup([gb], [gt])
    for pc, pg in zip(cpu.blobs, gpu.blobs):
        pc.data[...] = pc.data.astype(np.float32)  # same values in both precisions
        pg.data[...] = cp.asarray(pc.data, dtype=np.float32)
    cpu.forward([cb], [ct])
    gpu.forward([gb], [gt])
    dy = rng.standard_normal(ct.shape).astype(np.float32)
    ct.diff[...] = dy
    gt.diff[...] = cp.asarray(dy)
    for p in cpu.blobs + gpu.blobs:
        p.diff[...] = 0
    cpu.backward([ct], [True], [cb])
    gpu.backward([gt], [True], [gb])
    pairs = [(gt.data, ct.data), (gb.diff, cb.diff)]
    pairs += [(pg.diff, pc.diff) for pg, pc in zip(gpu.blobs, cpu.blobs)]
    for g, c in pairs:
        g = to_numpy(g)
        assert np.abs(g - c).max() <= 1e-5 * max(np.abs(c).max(), 1e-30)


@pytest.mark.gpu
def test_gpu_fcn_head_net_matches_cpu(cp):
    x, label = _fcn_inputs()
    results = []
    for mode in ("CPU", "GPU"):
        set_random_seed(5)
        net = Net(fcn_param(3, False), TRAIN, mode=mode)
        net.blobs["data"].data[...] = net.xp.asarray(x, dtype=np.float32)
        net.blobs["label"].data[...] = net.xp.asarray(label, dtype=np.float32)
        net.clear_param_diffs()
        loss = float(net.forward_backward())
        results.append((loss, [to_numpy(p.diff).copy() for p in net.learnable_params]))
    (lc, dc), (lg, dg) = results
    assert lg == pytest.approx(lc, rel=1e-5)
    for g, c in zip(dg, dc):
        assert np.abs(g - c).max() <= 1e-4 * max(np.abs(c).max(), 1e-30)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["basic", "groups", "no_bias", "fcn_upscore", "one_by_one"])
def test_gpu_shared_column_buffer_matches_cpu(cp, case, rng, monkeypatch):
    """A GPU layer without a memory manager lowers chunks of the shared bound (3 of 5
    images) into the device's shared buffers, allocating none of its own; the numbers are
    the CPU's, one image at a time."""
    from minicaffe.layers import conv as conv_mod
    body, _, shape = CASES[case]
    x = rng.standard_normal((5,) + shape[1:]).astype(np.float32)
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", 0)
    cpu = make_layer(deconv_text(body))
    (cb,), (ct,) = run(cpu, x)
    per_image = cpu.kdim * cpu.out_spatial * 4
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", per_image)
    monkeypatch.setattr(ConvolutionLayer, "shared_col_bytes", 3 * per_image)
    conv_mod.release_shared_scratch()
    gpu = make_layer(deconv_text(body), xp=cp, dtype=np.float32)
    gb = make_blob(x, xp=cp, dtype=np.float32)
    gt = Blob(xp=cp, dtype=np.float32)
    gpu.setup([gb], [gt])
    for pc, pg in zip(cpu.blobs, gpu.blobs):
        pg.data[...] = cp.asarray(pc.data, dtype=np.float32)
    cpu.forward([cb], [ct])
    gpu.forward([gb], [gt])
    dy = rng.standard_normal(ct.shape)
    ct.diff[...] = dy
    gt.diff[...] = cp.asarray(dy, dtype=np.float32)
    for p in cpu.blobs + gpu.blobs:
        p.diff[...] = 0
    cpu.backward([ct], [True], [cb])
    gpu.backward([gt], [True], [gb])
    if not gpu.is_1x1:
        assert gpu.chunk == 1 and gpu._run_chunk() == 3
        assert not gpu.internal("col").has_data  # the shared buffer served it
    for g, c in [(gt.data, ct.data), (gb.diff, cb.diff)] + [
            (pg.diff, pc.diff) for pg, pc in zip(gpu.blobs, cpu.blobs)]:
        g = to_numpy(g)
        assert np.abs(g - c).max() <= 1e-5 * max(np.abs(c).max(), 1e-30)
