"""Im2col: the columns against a loop over Caffe's im2col_cpu formula and torch's unfold,
Caffe's truncating output size, the axis field, gradients (col2im), errors, declarations, GPU."""
import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.testing import check_gradient, make_blob, make_layer


def im2col_text(body, name="im2col"):
    return f'name: "{name}" type: "Im2col" convolution_param {{ {body} }}'


def run(x, body, xp=np, dtype=np.float64):
    layer = make_layer(im2col_text(body), xp=xp, dtype=dtype)
    bottom = [make_blob(x, xp=xp, dtype=dtype, name="in")]
    top = [Blob(xp=xp, dtype=dtype, name="cols")]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return layer, bottom, top


def reference(x, kernel, pad, stride, dilation):
    """Caffe's im2col_cpu, one image at a time, element by element."""
    n, c, h, w = x.shape
    (kh, kw), (ph, pw), (sh, sw), (dh, dw) = kernel, pad, stride, dilation
    oh = int((h + 2 * ph - (dh * (kh - 1) + 1)) / sh) + 1  # C++ division truncates
    ow = int((w + 2 * pw - (dw * (kw - 1) + 1)) / sw) + 1
    out = np.zeros((n, c * kh * kw, oh, ow))
    for ci in range(c):
        for i in range(kh):
            for j in range(kw):
                row = (ci * kh + i) * kw + j
                for y in range(oh):
                    for z in range(ow):
                        hh, ww = y * sh - ph + i * dh, z * sw - pw + j * dw
                        if 0 <= hh < h and 0 <= ww < w:
                            out[:, row, y, z] = x[:, ci, hh, ww]
    return out


CASES = {
    "k3": ("kernel_size: 3", (3, 3), (0, 0), (1, 1), (1, 1), (2, 2, 5, 6)),
    "k3s2p1": ("kernel_size: 3 stride: 2 pad: 1", (3, 3), (1, 1), (2, 2), (1, 1), (2, 3, 7, 6)),
    "rect": ("kernel_h: 2 kernel_w: 3 stride_h: 1 stride_w: 2 pad_h: 0 pad_w: 1",
             (2, 3), (0, 1), (1, 2), (1, 1), (1, 2, 5, 7)),
    "dilated": ("kernel_size: 3 dilation: 2 pad: 2", (3, 3), (2, 2), (1, 1), (2, 2), (2, 2, 6, 5)),
    "per_axis": ("kernel_size: 2 kernel_size: 3 stride: 2 stride: 1 pad: 1 pad: 0",
                 (2, 3), (1, 0), (2, 1), (1, 1), (1, 2, 6, 6)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_matches_caffe_loop(case, rng):
    body, kernel, pad, stride, dilation, shape = CASES[case]
    x = rng.standard_normal(shape)
    _, _, (top,) = run(x, body)
    ref = reference(x, kernel, pad, stride, dilation)
    assert top.shape == ref.shape
    assert top.shape[1] == shape[1] * kernel[0] * kernel[1]
    np.testing.assert_array_equal(top.data, ref)


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_matches_torch_unfold(case, rng):
    torch = pytest.importorskip("torch")
    body, kernel, pad, stride, dilation, shape = CASES[case]
    x = rng.standard_normal(shape)
    _, _, (top,) = run(x, body)
    ref = torch.nn.functional.unfold(torch.tensor(x), kernel, dilation=dilation, padding=pad,
                                     stride=stride).numpy()
    np.testing.assert_array_equal(top.data.reshape(ref.shape), ref)


def test_output_size_truncates_toward_zero(rng):
    """2 rows, kernel 3, stride 2, no pad: (2 - 3) / 2 truncates to 0 (floor would give -1),
    so Caffe makes one output row, whose window reads a zero past the image."""
    x = rng.standard_normal((1, 1, 2, 4))
    _, _, (top,) = run(x, "kernel_h: 3 kernel_w: 1 stride_h: 2 stride_w: 1")
    assert top.shape == (1, 3, 1, 4)
    np.testing.assert_array_equal(top.data[0, :2, 0], x[0, 0])
    np.testing.assert_array_equal(top.data[0, 2, 0], 0)


def test_axis_field(rng):
    """axis 2 of a 5-axis bottom: the first two axes are independent images."""
    x = rng.standard_normal((2, 3, 2, 5, 4))
    _, _, (top,) = run(x, "kernel_size: 2 axis: 2")
    assert top.shape == (2, 3, 8, 4, 3)
    ref = reference(x.reshape(6, 2, 5, 4), (2, 2), (0, 0), (1, 1), (1, 1))
    np.testing.assert_array_equal(top.data.reshape(ref.shape), ref)


@pytest.mark.parametrize("body,shape", [("kernel_size: 3 stride: 2 pad: 1", (2, 2, 5, 4)),
                                        ("kernel_size: 2 dilation: 2", (1, 2, 5, 5)),
                                        ("kernel_h: 3 kernel_w: 2 stride: 1", (2, 1, 4, 3))])
def test_gradient(body, shape, rng):
    check_gradient(make_layer(im2col_text(body)), [make_blob(rng.standard_normal(shape))])


def test_backward_sums_overlaps_and_overwrites(rng):
    layer, bottom, top = run(rng.standard_normal((1, 1, 3, 3)), "kernel_size: 2")
    top[0].diff[...] = 1
    bottom[0].diff[...] = np.nan
    layer.backward(top, [True], bottom)
    # how many 2x2 windows cover each pixel of a 3x3 image
    np.testing.assert_array_equal(bottom[0].diff[0, 0], [[1, 2, 1], [2, 4, 2], [1, 2, 1]])


def test_declarations(rng):
    layer, bottom, top = run(rng.standard_normal((2, 2, 5, 5)), "kernel_size: 3")
    br = layer.backward_reads()
    assert br.bottom == () and br.top == () and br.internals == ()
    assert layer.internals == {}
    assert layer.flops(bottom, top) == (float(top[0].count), float(top[0].count))


@pytest.mark.parametrize("body,shape,match", [
    ("stride: 1", (1, 1, 4, 4), r"'im2col' \(Im2col\): kernel_size \(or kernel_h and kernel_w\) "
                                "must be specified"),
    ("kernel_size: 0", (1, 1, 4, 4), "filter dimensions must be nonzero"),
    ("kernel_size: 2 stride: 0", (1, 1, 4, 4), "stride dimensions must be nonzero"),
    ("kernel_size: 2 kernel_h: 2 kernel_w: 2", (1, 1, 4, 4), "not both"),
    ("kernel_size: 2 kernel_size: 2 kernel_size: 2", (1, 1, 4, 4),
     "kernel_size must be specified once, or once per spatial dimension"),
    ("kernel_size: 2 axis: 3", (1, 1, 4, 4), "lowering needs at least 1 spatial axis"),
    ("kernel_h: 2 kernel_w: 2", (1, 1, 4, 4, 4),
     "kernel_h & kernel_w can only be used for 2D convolution"),
    ("kernel_size: 2 axis: 4", (1, 1, 4, 4), "axis 4 out of range for bottom 'in'"),
    ("kernel_size: 6", (1, 1, 2, 2), r"does not fit the 2x2 input"),
])
def test_errors(body, shape, match):
    layer = make_layer(im2col_text(body))
    with pytest.raises(ValueError, match=match):
        layer.setup([make_blob(np.zeros(shape), name="in")], [Blob(dtype=np.float64)])


@pytest.mark.gpu
@pytest.mark.parametrize("body", ["kernel_size: 3 stride: 2 pad: 1", "kernel_size: 3",
                                  "kernel_h: 2 kernel_w: 5 dilation: 2 pad: 1"])
def test_gpu_matches_cpu(cp, body, rng):
    x = rng.standard_normal((4, 3, 11, 9)).astype(np.float32)
    outs = []
    for xp in (np, cp):
        layer, bottom, top = run(x, body, xp=xp, dtype=np.float32)
        top[0].diff[...] = xp.asarray(np.linspace(-1, 1, top[0].count, dtype=np.float32)
                                      .reshape(top[0].shape))
        layer.backward(top, [True], bottom)
        outs.append((to_numpy(top[0].data), to_numpy(bottom[0].diff)))
    np.testing.assert_array_equal(outs[1][0], outs[0][0])
    np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=1e-6, atol=1e-6)
