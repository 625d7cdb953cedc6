"""Convolution: forward against torch and hand-computed values, gradient checks
for every configuration, Caffe's diff semantics, declarations, errors, GPU."""
import os

import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layers.conv import ConvolutionLayer
from minicaffe.rng import set_random_seed
from minicaffe.testing.gradient_check import check_gradient, make_blob, make_layer


def conv_text(body, fillers=True, name="conv"):
    if fillers:
        body += ' weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" }'
    return f'name: "{name}" type: "Convolution" convolution_param {{ {body} }}'


def run(layer, *xs, xp=np, dtype=np.float64):
    bottom = [make_blob(x, xp=xp, dtype=dtype, name=f"in{i}") for i, x in enumerate(xs)]
    top = [Blob(xp=xp, dtype=dtype, name=f"out{i}") for i in range(len(xs))]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return bottom, top


# name: (prototxt body, torch conv2d kwargs, input shape)
CASES = {
    "basic": ("num_output: 4 kernel_size: 3", dict(), (2, 3, 6, 5)),
    "pad_stride": ("num_output: 3 kernel_size: 3 pad: 1 stride: 2",
                   dict(stride=2, padding=1), (2, 2, 7, 6)),
    "rect_hw_fields": ("num_output: 3 kernel_h: 3 kernel_w: 2 pad_h: 1 pad_w: 0 stride_h: 2 "
                       "stride_w: 1", dict(stride=(2, 1), padding=(1, 0)), (2, 2, 7, 5)),
    "rect_repeated": ("num_output: 2 kernel_size: 2 kernel_size: 3 pad: 0 pad: 1 stride: 1 "
                      "stride: 2", dict(stride=(1, 2), padding=(0, 1)), (1, 3, 5, 6)),
    "groups": ("num_output: 4 kernel_size: 3 pad: 1 group: 2", dict(padding=1, groups=2),
               (2, 4, 5, 5)),
    "depthwise": ("num_output: 3 kernel_size: 3 group: 3 stride: 2",
                  dict(groups=3, stride=2), (2, 3, 7, 7)),
    "dilation": ("num_output: 3 kernel_size: 3 dilation: 2 pad: 2", dict(dilation=2, padding=2),
                 (2, 2, 7, 6)),
    "dilation_rect": ("num_output: 2 kernel_size: 2 dilation: 3 dilation: 1 pad_h: 1 pad_w: 2",
                      dict(dilation=(3, 1), padding=(1, 2)), (1, 2, 8, 5)),
    "one_by_one": ("num_output: 5 kernel_size: 1", dict(), (2, 3, 4, 3)),
    "one_by_one_strided": ("num_output: 2 kernel_size: 1 stride: 2", dict(stride=2),
                           (2, 3, 5, 4)),
    "no_bias": ("num_output: 3 kernel_size: 2 bias_term: false stride: 2", dict(stride=2),
                (2, 2, 6, 7)),
    "groups_dilation_stride": ("num_output: 6 kernel_h: 2 kernel_w: 3 group: 3 dilation: 2 "
                               "stride_h: 1 stride_w: 2 pad_h: 2 pad_w: 1",
                               dict(groups=3, dilation=2, stride=(1, 2), padding=(2, 1)),
                               (2, 3, 6, 7)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_matches_torch(case, rng):
    torch = pytest.importorskip("torch")
    body, kwargs, shape = CASES[case]
    layer = make_layer(conv_text(body))
    x = rng.standard_normal(shape)
    _, (top,) = run(layer, x)
    bias = torch.tensor(layer.blobs[1].data) if layer.bias_term else None
    ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(layer.blobs[0].data), bias,
                                     **kwargs).numpy()
    assert top.shape == ref.shape
    np.testing.assert_allclose(top.data, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", ["pad_stride", "groups_dilation_stride", "one_by_one"])
def test_backward_matches_torch_autograd(case, rng):
    torch = pytest.importorskip("torch")
    body, kwargs, shape = CASES[case]
    layer = make_layer(conv_text(body))
    x = rng.standard_normal(shape)
    (bottom,), (top,) = run(layer, x)
    dy = rng.standard_normal(top.shape)
    top.diff[...] = dy
    layer.blobs[0].diff[...] = 0
    layer.blobs[1].diff[...] = 0
    layer.backward([top], [True], [bottom])
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(layer.blobs[0].data, requires_grad=True)
    tb = torch.tensor(layer.blobs[1].data, requires_grad=True)
    torch.nn.functional.conv2d(tx, tw, tb, **kwargs).backward(torch.tensor(dy))
    np.testing.assert_allclose(bottom.diff, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(layer.blobs[0].diff, tw.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(layer.blobs[1].diff, tb.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_hand_computed_values():
    # 3x3 image 1..9, 2x2 kernel [[1, 0], [0, -1]], bias 0.5, pad 0, stride 1:
    # out[y, x] = img[y, x] - img[y+1, x+1] + 0.5 = -4 + 0.5 everywhere.
    layer = make_layer(conv_text("num_output: 1 kernel_size: 2", fillers=False))
    x = np.arange(1, 10, dtype=np.float64).reshape(1, 1, 3, 3)
    bottom = [make_blob(x)]
    top = [Blob(dtype=np.float64)]
    layer.setup(bottom, top)
    layer.blobs[0].data[...] = np.array([[1, 0], [0, -1]]).reshape(1, 1, 2, 2)
    layer.blobs[1].data[...] = 0.5
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, np.full((1, 1, 2, 2), -3.5))
    # stride 2, pad 1: windows at (-1,-1), (-1,1), (1,-1), (1,1)
    layer = make_layer(conv_text("num_output: 1 kernel_size: 2 pad: 1 stride: 2", fillers=False))
    top = [Blob(dtype=np.float64)]
    layer.setup(bottom, top)
    layer.blobs[0].data[...] = np.array([[1, 0], [0, -1]]).reshape(1, 1, 2, 2)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data[0, 0], [[-1.0, -3.0], [-7.0, 5.0 - 9.0]])


def test_caffe_output_size_and_param_shapes():
    layer = make_layer(conv_text("num_output: 96 kernel_size: 11 stride: 4"))
    _, (top,) = run(layer, np.zeros((1, 3, 227, 227)))
    assert top.shape == (1, 96, 55, 55)
    assert layer.blobs[0].shape == (96, 3, 11, 11)
    assert layer.blobs[1].shape == (96,)
    layer = make_layer(conv_text("num_output: 256 kernel_size: 5 pad: 2 group: 2"))
    _, (top,) = run(layer, np.zeros((1, 96, 27, 27)))
    assert top.shape == (1, 256, 27, 27)
    assert layer.blobs[0].shape == (256, 48, 5, 5)


def test_weight_filler_defaults_to_zero_constant():
    layer = make_layer(conv_text("num_output: 2 kernel_size: 1", fillers=False))
    run(layer, np.ones((1, 2, 2, 2)))
    assert not layer.blobs[0].data.any() and not layer.blobs[1].data.any()


# ------------------------------------------------------------- gradients
@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient(case, rng):
    body, _, shape = CASES[case]
    layer = make_layer(conv_text(body))
    # small spatial extents keep the numerical check fast
    n, c, h, w = shape
    x = rng.standard_normal((min(n, 2), c, min(h, 6), min(w, 6)))
    check_gradient(layer, [make_blob(x)])


def test_gradient_two_bottoms_share_weights(rng):
    layer = make_layer(conv_text("num_output: 2 kernel_size: 2 pad: 1 stride: 2"))
    xs = [rng.standard_normal((2, 2, 4, 5)) for _ in range(2)]
    check_gradient(layer, [make_blob(x) for x in xs],
                   top=[Blob(dtype=np.float64), Blob(dtype=np.float64)])


def test_gradient_axis_two(rng):
    # bottom (A, B, C, H, W) with axis 2: A*B independent images
    layer = make_layer(conv_text("num_output: 2 kernel_size: 2 axis: 2"))
    check_gradient(layer, [make_blob(rng.standard_normal((2, 2, 3, 4, 4)))])
    assert layer.blobs[0].shape == (2, 3, 2, 2)


def test_gradient_with_one_image_chunks(rng, monkeypatch):
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", 0)
    layer = make_layer(conv_text("num_output: 3 kernel_size: 3 pad: 1 group: 3"))
    check_gradient(layer, [make_blob(rng.standard_normal((3, 3, 4, 4)))])
    assert layer.chunk == 1
    assert layer.internal("col").shape == (1, 27, 16)  # Caffe's one-image buffer
    assert "top_diff_t" not in layer.internals


def test_chunked_equals_whole_batch(rng, monkeypatch):
    x = rng.standard_normal((5, 4, 6, 6))
    dy = rng.standard_normal((5, 3, 6, 6))
    results = []
    per_image = 36 * 36 * 8  # C*kh*kw x OH*OW float64
    for limit in (1 << 30, 0, 2 * per_image):  # whole batch, one image, two images
        monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", limit)
        set_random_seed(3)
        layer = make_layer(conv_text("num_output: 3 kernel_size: 3 pad: 1"))
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
    layer = make_layer(conv_text("num_output: 2 kernel_size: 3 pad: 1"))
    (bottom,), (top,) = run(layer, rng.standard_normal((2, 2, 4, 4)))
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
    layer = make_layer(conv_text("num_output: 2 kernel_size: 3"))
    (bottom,), (top,) = run(layer, rng.standard_normal((1, 2, 4, 4)))
    top.diff[...] = 1
    bottom.diff[...] = 3
    layer.param_propagate_down = [False, True]
    layer.blobs[0].diff[...] = 0
    layer.backward([top], [False], [bottom])
    assert (bottom.diff == 3).all()
    assert not layer.blobs[0].diff.any()
    np.testing.assert_allclose(layer.blobs[1].diff, [4.0, 4.0])


# -------------------------------------------------------- declarations
def test_backward_reads_and_internals(rng):
    layer = make_layer(conv_text("num_output: 2 kernel_size: 3"))
    run(layer, rng.standard_normal((2, 2, 5, 5)))
    reads = layer.backward_reads()
    assert reads.bottom == (0,) and reads.top == () and reads.internals == ()
    col = layer.internals["col"]
    assert not col.saved
    assert col.blob.shape == (2, 18, 9)
    # the chunk's top diff, transposed for the weight-gradient GEMM
    top_t = layer.internals["top_diff_t"]
    assert not top_t.saved and top_t.blob.shape == (2, 2 * 9)
    layer.param_propagate_down = [False, True]
    assert layer.backward_reads().bottom == ()
    # 1x1 convolutions need no lowering buffer (Caffe never touches it)
    layer = make_layer(conv_text("num_output: 2 kernel_size: 1"))
    run(layer, rng.standard_normal((2, 2, 5, 5)))
    assert "col" not in layer.internals


def test_flops():
    layer = make_layer(conv_text("num_output: 4 kernel_size: 3 group: 2"))
    bottom, top = run(layer, np.zeros((2, 6, 5, 5)))
    fwd, bwd = layer.flops(bottom, top)
    macs = 2 * 4 * (3 * 9) * 9
    assert fwd == 2 * macs + 2 * 4 * 9
    assert bwd == 2 * fwd


@pytest.mark.parametrize("engine", ["DEFAULT", "CAFFE", "CUDNN"])
def test_engines_compute_the_same(engine, rng):
    x = rng.standard_normal((1, 2, 4, 4))
    outs = []
    for body in ("num_output: 2 kernel_size: 3", f"num_output: 2 kernel_size: 3 engine: {engine}"):
        set_random_seed(7)
        _, (top,) = run(make_layer(conv_text(body)), x)
        outs.append(top.data.copy())
    np.testing.assert_array_equal(outs[0], outs[1])


def test_force_nd_im2col_accepted(rng):
    x = rng.standard_normal((1, 2, 5, 5))
    a = make_layer(conv_text("num_output: 2 kernel_size: 3"))
    _, (ta,) = run(a, x)
    b = make_layer(conv_text("num_output: 2 kernel_size: 3 force_nd_im2col: true"))
    bottom = [make_blob(x)]
    top = [Blob(dtype=np.float64)]
    b.setup(bottom, top)
    b.blobs[0].data[...] = a.blobs[0].data
    b.blobs[1].data[...] = a.blobs[1].data
    b.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, ta.data)


def test_reshape_follows_bottom(rng):
    layer = make_layer(conv_text("num_output: 2 kernel_size: 3 pad: 1 stride: 2"))
    bottom, top = run(layer, rng.standard_normal((2, 2, 6, 6)))
    bottom[0].reshape(3, 2, 9, 7)
    layer.reshape(bottom, top)
    assert top[0].shape == (3, 2, 5, 4)


# --------------------------------------------------------------- errors
@pytest.mark.parametrize("body,shape,message", [
    ("num_output: 2", (1, 2, 4, 4), "kernel_size"),
    ("num_output: 2 kernel_size: 3 kernel_h: 3 kernel_w: 3", (1, 2, 4, 4), "not both"),
    ("num_output: 2 kernel_size: 3 kernel_size: 3 kernel_size: 3", (1, 2, 4, 4),
     "once per spatial dimension"),
    ("num_output: 2 kernel_size: 3 stride: 2 stride_h: 2 stride_w: 1", (1, 2, 4, 4), "not both"),
    ("num_output: 2 kernel_size: 3 pad: 1 pad_h: 1", (1, 2, 4, 4), "not both"),
    ("num_output: 2 kernel_size: 0", (1, 2, 4, 4), "nonzero"),
    ("num_output: 2 kernel_size: 3 stride: 0", (1, 2, 4, 4), "nonzero"),
    ("num_output: 0 kernel_size: 3", (1, 2, 4, 4), "num_output"),
    ("num_output: 2 kernel_size: 3 group: 2", (1, 3, 4, 4), "multiple of group"),
    ("num_output: 3 kernel_size: 3 group: 2", (1, 2, 4, 4), "multiple of group"),
    ("num_output: 2 kernel_h: 3 kernel_w: 3", (1, 2, 4, 4, 4),
     "kernel_h & kernel_w can only be used for 2D convolution"),
    ("num_output: 2 kernel_size: 3 kernel_size: 3", (1, 2, 4, 4, 4),
     "once per spatial dimension"),
    ("num_output: 2 kernel_size: 7", (1, 2, 4, 4), "does not fit"),
])
def test_bad_params_raise_clear_errors(body, shape, message):
    layer = make_layer(conv_text(body, fillers=False, name="bad"))
    with pytest.raises(ValueError, match=message) as err:
        run(layer, np.zeros(shape))
    assert "'bad'" in str(err.value)


def test_channel_change_is_an_error():
    layer = make_layer(conv_text("num_output: 2 kernel_size: 3"))
    bottom, top = run(layer, np.zeros((1, 2, 4, 4)))
    bottom[0].reshape(1, 3, 4, 4)
    with pytest.raises(ValueError, match="incompatible"):
        layer.reshape(bottom, top)


def test_bottoms_must_agree():
    layer = make_layer(conv_text("num_output: 2 kernel_size: 3"))
    bottom = [make_blob(np.zeros((1, 2, 4, 4))), make_blob(np.zeros((1, 2, 5, 4)))]
    with pytest.raises(ValueError, match="shape mismatch"):
        layer.setup(bottom, [Blob(dtype=np.float64), Blob(dtype=np.float64)])


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("case", ["basic", "pad_stride", "rect_hw_fields", "groups",
                                  "dilation_rect", "one_by_one", "no_bias",
                                  "groups_dilation_stride"])
@pytest.mark.parametrize("limit", [64 << 20, 0])
def test_gpu_matches_numpy(cp, case, limit, rng, monkeypatch):
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", limit)
    body, _, shape = CASES[case]
    shape = (5,) + shape[1:]
    x = rng.standard_normal(shape).astype(np.float32)
    cpu = make_layer(conv_text(body))
    gpu = make_layer(conv_text(body), xp=cp, dtype=np.float32)
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


def test_col_buffer_bound_from_the_environment():
    import subprocess
    import sys
    code = "from minicaffe.layers.conv import ConvolutionLayer as C; print(C.col_buffer_bytes)"
    for text, want in (("", 64 << 20), ("1G", 1 << 30), ("0", 0)):
        env = dict(os.environ, MINICAFFE_COL_BUFFER=text)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, check=True).stdout
        assert int(out) == want, text
    bad = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, MINICAFFE_COL_BUFFER="lots"))
    assert bad.returncode != 0 and "MINICAFFE_COL_BUFFER" in bad.stderr


# ------------------------------------------------------- the cuBLAS branch
CUBLAS_CASES = dict(CASES, one_by_one_groups=("num_output: 4 kernel_size: 1 group: 2", {},
                                              (3, 4, 3, 5)))


def _conv_run(body, shape, calls=2, two_bottoms=False):
    """Forward, then ``calls`` backward passes from zeroed param diffs (float64):
    copies of the tops, the bottom diffs and the param diffs."""
    r = np.random.default_rng(5)
    set_random_seed(5)
    layer = make_layer(conv_text(body))
    xs = [r.standard_normal(shape) for _ in range(2 if two_bottoms else 1)]
    bottom, top = run(layer, *xs)
    for t in top:
        t.diff[...] = r.standard_normal(t.shape)
    for p in layer.blobs:
        p.diff[...] = 0
    for _ in range(calls):
        layer.backward(top, [True] * len(bottom), bottom)
    return ([t.data.copy() for t in top] + [b.diff.copy() for b in bottom]
            + [p.diff.copy() for p in layer.blobs])


@pytest.mark.parametrize("case", sorted(CUBLAS_CASES))
@pytest.mark.parametrize("limit", [64 << 20, 0])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("loop", [0, 4])
def test_cublas_branch_computes_the_numpy_branch(case, limit, batch, loop, monkeypatch):
    """The GPU's cuBLAS calls (planned by minicaffe.cublas, run on the host by
    minicaffe.testing.cublas_host) give the NumPy path's numbers: whole-batch and
    one-image chunks, groups (a GEMM per group, or one batched launch), 1x1, param
    diffs accumulating over two passes."""
    from minicaffe.testing.cublas_host import on_host
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", limit)
    monkeypatch.setattr(ConvolutionLayer, "group_loop_max", loop)
    body, _, shape = CUBLAS_CASES[case]
    shape = (batch,) + shape[1:]
    ref = _conv_run(body, shape)
    with on_host(monkeypatch) as calls:
        got = _conv_run(body, shape)
    assert calls and set(calls) <= {"gemm", "gemm_strided_batched"}
    if loop == 0:
        assert set(calls) == {"gemm_strided_batched"}
    for g, c in zip(got, ref):
        np.testing.assert_allclose(g, c, rtol=1e-12, atol=1e-12)


def test_cublas_branch_two_bottoms(monkeypatch):
    from minicaffe.testing.cublas_host import on_host
    body = "num_output: 4 kernel_size: 3 pad: 1 group: 2"
    ref = _conv_run(body, (2, 4, 5, 5), two_bottoms=True)
    with on_host(monkeypatch):
        got = _conv_run(body, (2, 4, 5, 5), two_bottoms=True)
    for g, c in zip(got, ref):
        np.testing.assert_allclose(g, c, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", ["basic", "groups", "one_by_one", "groups_dilation_stride"])
@pytest.mark.parametrize("batch", [1, 3])
def test_cublas_bias_gradient_by_gemm(case, batch, monkeypatch):
    """Tops of at least _BIAS_GEMM_MIN_PIXELS pixels take the bias gradient as two GEMMs
    (per image over its pixels into the ``bias_sums`` internal, then over the images,
    accumulating): the same diffs as the reduction, over two backward passes."""
    from minicaffe.layers import conv as conv_mod
    from minicaffe.testing.cublas_host import on_host
    body, _, shape = CUBLAS_CASES[case]
    shape = (batch,) + shape[1:]
    ref = _conv_run(body, shape)
    monkeypatch.setattr(conv_mod, "_BIAS_GEMM_MIN_PIXELS", 1)
    with on_host(monkeypatch):
        layer = make_layer(conv_text(body))
        run(layer, np.zeros(shape))
        assert layer.internal("bias_sums").shape == (batch, layer.num_output)
        got = _conv_run(body, shape)
    for g, c in zip(got, ref):
        np.testing.assert_allclose(g, c, rtol=1e-12, atol=1e-12)


def test_bias_sums_only_where_the_gemm_takes_the_bias():
    """NumPy layers (and small tops on a GPU) reduce in place: no internal is declared,
    so the memory model of a CPU net is what it was."""
    layer = make_layer(conv_text("num_output: 2 kernel_size: 3 pad: 1"))
    run(layer, np.zeros((2, 3, 30, 30)))
    assert "bias_sums" not in layer.internals


@pytest.mark.parametrize("case", ["groups", "one_by_one", "one_by_one_groups"])
@pytest.mark.parametrize("bias_gemm", [False, True])
def test_cublas_branch_gradient(case, bias_gemm, rng, monkeypatch):
    from minicaffe.layers import conv as conv_mod
    from minicaffe.testing.cublas_host import on_host
    body, _, shape = CUBLAS_CASES[case]
    if bias_gemm:
        monkeypatch.setattr(conv_mod, "_BIAS_GEMM_MIN_PIXELS", 1)
    with on_host(monkeypatch):
        layer = make_layer(conv_text(body))
        check_gradient(layer, [make_blob(rng.standard_normal((2,) + shape[1:]))])


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["basic", "groups", "one_by_one", "one_by_one_groups",
                                  "groups_dilation_stride", "depthwise"])
@pytest.mark.parametrize("limit", [64 << 20, 0])
@pytest.mark.parametrize("path", ["cublas", "cupy"])
def test_gpu_gemm_paths_match_cpu(cp, case, limit, path, rng, monkeypatch):
    """Both GPU paths of the CAFFE engine (minicaffe.cublas, and CuPy's matmul/dot/
    tensordot where it does not load) against the CPU, with two backward passes."""
    import contextlib
    from minicaffe import cublas
    if path == "cublas" and not cublas.enabled_for(cp):
        pytest.fail("minicaffe.cublas is not usable here: " + cublas.unavailable_reason(cp))
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", limit)
    body, _, shape = CUBLAS_CASES[case]
    x = rng.standard_normal((5,) + shape[1:]).astype(np.float32)
    ctx = cublas.disabled() if path == "cupy" else contextlib.nullcontext()
    with ctx:
        cpu = make_layer(conv_text(body))
        gpu = make_layer(conv_text(body), xp=cp, dtype=np.float32)
        (cb,), (ct,) = run(cpu, x)
        gb = make_blob(x, xp=cp, dtype=np.float32)
        gt = Blob(xp=cp, dtype=np.float32)
        gpu.setup([gb], [gt])
        for pc, pg in zip(cpu.blobs, gpu.blobs):
            pc.data[...] = pc.data.astype(np.float32)
            pg.data[...] = cp.asarray(pc.data, dtype=np.float32)
        cpu.forward([cb], [ct])
        gpu.forward([gb], [gt])
        dy = rng.standard_normal(ct.shape).astype(np.float32)
        ct.diff[...] = dy
        gt.diff[...] = cp.asarray(dy)
        for p in cpu.blobs + gpu.blobs:
            p.diff[...] = 0
        gb.diff[...] = np.nan  # overwritten, never read
        for _ in range(2):
            cpu.backward([ct], [True], [cb])
            gpu.backward([gt], [True], [gb])
    pairs = [(gt.data, ct.data), (gb.diff, cb.diff)]
    pairs += [(pg.diff, pc.diff) for pg, pc in zip(gpu.blobs, cpu.blobs)]
    for g, c in pairs:
        g = to_numpy(g)
        assert np.abs(g - c).max() <= 1e-5 * max(np.abs(c).max(), 1e-30)


def test_balanced_chunk_splits_evenly():
    from minicaffe.layers.conv import balanced_chunk
    assert balanced_chunk(64, 9) == 8          # 8 chunks of 8, not 7 of 9 and one of 1
    assert balanced_chunk(64, 1000) == 64
    assert balanced_chunk(5, 3) == 3           # 3 + 2
    assert balanced_chunk(7, 0) == 1           # at least one image
    for num in range(1, 40):
        for bound in range(1, 45):
            c = balanced_chunk(num, bound)
            pieces = -(-num // c)
            assert 1 <= c <= max(1, min(num, bound)) and pieces == -(-num // min(num, bound))


def test_cpu_layers_keep_their_own_column_buffer(monkeypatch):
    """Sharing one column buffer is for GPU layers; on NumPy the chunk is the declared one."""
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", 36 * 36 * 8)
    monkeypatch.setattr(ConvolutionLayer, "shared_col_bytes", 1 << 30)
    layer = make_layer(conv_text("num_output: 3 kernel_size: 3 pad: 1"))
    run(layer, np.ones((5, 4, 6, 6)))
    assert layer.chunk == 1 and layer._run_chunk() == 1 and layer.internal("col").has_data


def _gpu_step_beside(cp, cpu, gpu, x, cb, ct, rng):
    """Set the float32 GPU layer up on x with the CPU layer's weights, then forward and one
    backward of both from zeroed param diffs (the CPU layer has run forward on x)."""
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
    return gb, gt


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["basic", "groups", "no_bias", "pad_stride", "one_by_one"])
def test_gpu_shared_column_buffer_matches_cpu(cp, case, rng, monkeypatch):
    """A GPU layer without a memory manager lowers chunks of the shared bound (here 3 of 5
    images: a flat GEMM per chunk, the bias added in the transpose) into the device's
    shared buffers, allocating none of its own; the numbers are the CPU's, one image at
    a time."""
    from minicaffe.layers import conv as conv_mod
    body, _, shape = CASES[case]
    x = rng.standard_normal((5,) + shape[1:]).astype(np.float32)
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", 0)
    cpu = make_layer(conv_text(body))
    (cb,), (ct,) = run(cpu, x)
    probe = make_layer(conv_text(body))
    run(probe, x[:1])
    per_image = probe.kdim * probe.out_spatial * 4
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", per_image)
    monkeypatch.setattr(ConvolutionLayer, "shared_col_bytes", 3 * per_image)
    conv_mod.release_shared_scratch()
    gpu = make_layer(conv_text(body), xp=cp, dtype=np.float32)
    gb, gt = _gpu_step_beside(cp, cpu, gpu, x, cb, ct, rng)
    if not gpu.is_1x1:
        assert gpu.chunk == 1 and gpu._run_chunk() == 3
        assert not gpu.internal("col").has_data  # the shared buffer served it
    for g, c in [(gt.data, ct.data), (gb.diff, cb.diff)] + [
            (pg.diff, pc.diff) for pg, pc in zip(gpu.blobs, cpu.blobs)]:
        g = to_numpy(g)
        assert np.abs(g - c).max() <= 1e-5 * max(np.abs(c).max(), 1e-30)


@pytest.mark.parametrize("body", ["num_output: 4 kernel_size: 3 pad: 1",
                                  "num_output: 4 kernel_size: 3 pad: 1 group: 2"])
def test_split_weight_gradient_sums_like_one_gemm(body, monkeypatch):
    """A small weight's gradient over many columns (here 2 x 96 x 96) is summed as S
    partial products and a GEMM with a row of ones (the GPU's cuBLAS calls, run on the
    host): the NumPy path's numbers, accumulated over two backward passes."""
    from minicaffe.testing.cublas_host import on_host
    monkeypatch.setattr(ConvolutionLayer, "wgrad_split_max", 1 << 16)  # off by default
    shape = (2, 4, 96, 96)
    ref = _conv_run(body, shape)
    with on_host(monkeypatch) as calls:
        layer = make_layer(conv_text(body))
        run(layer, np.zeros(shape))
        assert layer._wgrad_segments(2 * 96 * 96) == 4
        assert layer.internal("wgrad_parts").shape == (64 * 4 * 36 // layer.group,)
        got = _conv_run(body, shape)
    assert "gemm" in calls  # the reduction with the row of ones
    for g, c in zip(got, ref):
        np.testing.assert_allclose(g, c, rtol=1e-11, atol=1e-11)


def test_split_weight_gradient_off_for_large_weights(monkeypatch):
    from minicaffe.testing.cublas_host import on_host
    with on_host(monkeypatch):
        monkeypatch.setattr(ConvolutionLayer, "wgrad_split_max", 100)
        layer = make_layer(conv_text("num_output: 4 kernel_size: 3 pad: 1"))
        run(layer, np.zeros((2, 4, 96, 96)))
        assert layer._wgrad_segments(2 * 96 * 96) == 1 and "wgrad_parts" not in layer.internals


@pytest.mark.gpu
def test_gpu_split_weight_gradient_matches_cpu(cp, rng, monkeypatch):
    body = "num_output: 8 kernel_size: 3 pad: 1"
    monkeypatch.setattr(ConvolutionLayer, "wgrad_split_max", 1 << 16)  # off by default
    x = rng.standard_normal((4, 3, 64, 64)).astype(np.float32)
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", 0)
    cpu = make_layer(conv_text(body))
    (cb,), (ct,) = run(cpu, x)
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", 64 << 20)
    gpu = make_layer(conv_text(body), xp=cp, dtype=np.float32)
    _gpu_step_beside(cp, cpu, gpu, x, cb, ct, rng)
    assert gpu._wgrad_segments(4 * 64 * 64) == 4
    g, c = to_numpy(gpu.blobs[0].diff), cpu.blobs[0].diff
    assert np.abs(g - c).max() <= 1e-5 * np.abs(c).max()
