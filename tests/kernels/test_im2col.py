"""Batched im2col/col2im: against a loop that follows Caffe's im2col_cpu literally,
adjointness, and the CUDA kernels against the generic code."""
import numpy as np
import pytest

from minicaffe.kernels import cuda_vision
from minicaffe.kernels.im2col import col2im, col_shape, conv_out_size, im2col

# (kernel, pad, stride, dilation), each an int or an (h, w) pair
CONFIGS = [
    (3, 1, 1, 1),
    (3, 0, 2, 1),
    ((3, 2), (1, 0), (2, 1), 1),
    ((2, 3), (0, 2), (1, 3), (2, 1)),
    (3, 2, 1, 2),
    (1, 0, 1, 1),
    (1, 1, 2, 1),
    ((5, 1), (2, 0), (3, 1), (1, 1)),
]


def pair(v):
    return (v, v) if isinstance(v, int) else v


def im2col_reference(x, kernel, pad, stride, dilation):
    """Caffe's im2col_cpu, image by image, element by element."""
    (kh, kw), (ph, pw), (sh, sw), (dh, dw) = map(pair, (kernel, pad, stride, dilation))
    n, c, h, w = x.shape
    oh = conv_out_size(h, kh, ph, sh, dh)
    ow = conv_out_size(w, kw, pw, sw, dw)
    col = np.zeros((n, c * kh * kw, oh * ow), dtype=x.dtype)
    for b in range(n):
        for ch in range(c):
            for i in range(kh):
                for j in range(kw):
                    row = (ch * kh + i) * kw + j
                    for y in range(oh):
                        for z in range(ow):
                            hh = y * sh - ph + i * dh
                            ww = z * sw - pw + j * dw
                            if 0 <= hh < h and 0 <= ww < w:
                                col[b, row, y * ow + z] = x[b, ch, hh, ww]
    return col


def col2im_reference(col, shape, kernel, pad, stride, dilation):
    (kh, kw), (ph, pw), (sh, sw), (dh, dw) = map(pair, (kernel, pad, stride, dilation))
    n, c, h, w = shape
    oh = conv_out_size(h, kh, ph, sh, dh)
    ow = conv_out_size(w, kw, pw, sw, dw)
    x = np.zeros(shape, dtype=col.dtype)
    for b in range(n):
        for ch in range(c):
            for i in range(kh):
                for j in range(kw):
                    row = (ch * kh + i) * kw + j
                    for y in range(oh):
                        for z in range(ow):
                            hh = y * sh - ph + i * dh
                            ww = z * sw - pw + j * dw
                            if 0 <= hh < h and 0 <= ww < w:
                                x[b, ch, hh, ww] += col[b, row, y * ow + z]
    return x


def test_conv_out_size_follows_caffe():
    assert conv_out_size(7, 3, 1, 2) == 4
    assert conv_out_size(224, 11, 0, 4) == 54
    assert conv_out_size(5, 3, 0, 1, dilation=2) == 1
    assert conv_out_size(6, 3, 0, 2) == 2  # floor
    # C++ division truncates toward zero: (2 + 2 - 5) / 2 == 0 -> one output
    assert conv_out_size(2, 5, 1, 2) == 1
    assert conv_out_size(1, 5, 0, 2) == -1  # (1 - 5) / 2 + 1: no output at all


@pytest.mark.parametrize("kernel,pad,stride,dilation", CONFIGS)
def test_im2col_matches_caffe_loop(kernel, pad, stride, dilation, rng):
    x = rng.standard_normal((2, 3, 7, 8))
    col = im2col(x, kernel, pad, stride, dilation)
    assert col.shape == col_shape(x.shape, kernel, pad, stride, dilation)
    np.testing.assert_array_equal(col, im2col_reference(x, kernel, pad, stride, dilation))


@pytest.mark.parametrize("kernel,pad,stride,dilation", CONFIGS)
def test_col2im_matches_caffe_loop(kernel, pad, stride, dilation, rng):
    shape = (2, 3, 7, 8)
    col = rng.standard_normal(col_shape(shape, kernel, pad, stride, dilation))
    np.testing.assert_allclose(col2im(col, shape, kernel, pad, stride, dilation),
                               col2im_reference(col, shape, kernel, pad, stride, dilation),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel,pad,stride,dilation", CONFIGS)
def test_col2im_is_adjoint_of_im2col(kernel, pad, stride, dilation, rng):
    x = rng.standard_normal((2, 3, 6, 9))
    c = rng.standard_normal(col_shape(x.shape, kernel, pad, stride, dilation))
    lhs = np.vdot(im2col(x, kernel, pad, stride, dilation), c)
    rhs = np.vdot(x, col2im(c, x.shape, kernel, pad, stride, dilation))
    assert lhs == pytest.approx(rhs, rel=1e-12)


@pytest.mark.parametrize("kernel,pad,stride,dilation", CONFIGS)
def test_row_major_over_batch_layout(kernel, pad, stride, dilation, rng):
    x = rng.standard_normal((3, 2, 6, 7))
    ref = im2col_reference(x, kernel, pad, stride, dilation)
    col = im2col(x, kernel, pad, stride, dilation, batch_major=False)
    assert col.shape == col_shape(x.shape, kernel, pad, stride, dilation, batch_major=False)
    np.testing.assert_array_equal(col, ref.transpose(1, 0, 2))
    c = rng.standard_normal(col.shape)
    np.testing.assert_allclose(
        col2im(c, x.shape, kernel, pad, stride, dilation, batch_major=False),
        col2im_reference(np.ascontiguousarray(c.transpose(1, 0, 2)), x.shape, kernel, pad,
                         stride, dilation), rtol=1e-12, atol=1e-12)


def test_out_arguments_are_written_in_place(rng):
    x = rng.standard_normal((2, 2, 5, 5)).astype(np.float32)
    out = np.full(col_shape(x.shape, 3, 1, 2), 7.0, dtype=np.float32)
    res = im2col(x, 3, 1, 2, out=out)
    assert res is out
    np.testing.assert_array_equal(out, im2col_reference(x, 3, 1, 2, 1))
    img = np.full(x.shape, 7.0, dtype=np.float32)
    col2im(out, x.shape, 3, 1, 2, out=img)  # overwritten, not accumulated
    np.testing.assert_allclose(img, col2im_reference(out, x.shape, 3, 1, 2, 1), rtol=1e-6)


def test_non_contiguous_input(rng):
    base = rng.standard_normal((2, 3, 6, 10))
    x = base[:, :, :, ::2]  # strided view (2, 3, 6, 5)
    np.testing.assert_array_equal(im2col(x, 2, 0, 1), im2col_reference(np.ascontiguousarray(x),
                                                                        2, 0, 1, 1))


def test_kernel_overhanging_padded_input_reads_zeros(rng):
    # 2x2 input, 5x5 kernel, pad 1, stride 2: Caffe makes one output whose window
    # reaches past the padding.
    x = rng.standard_normal((1, 1, 2, 2))
    col = im2col(x, 5, 1, 2)
    assert col.shape == (1, 25, 1)
    np.testing.assert_array_equal(col, im2col_reference(x, 5, 1, 2, 1))
    c = rng.standard_normal(col.shape)
    assert np.vdot(col, c) == pytest.approx(np.vdot(x, col2im(c, x.shape, 5, 1, 2)))


def test_empty_output_is_an_error():
    with pytest.raises(ValueError, match="does not fit"):
        im2col(np.zeros((1, 1, 2, 2)), 7, 0, 1)
    with pytest.raises(ValueError, match="do not match"):
        col2im(np.zeros((1, 4, 3)), (1, 1, 3, 3), 2, 0, 1)


def test_cuda_module_imports_without_gpu():
    assert isinstance(cuda_vision.available(), bool)
    assert cuda_vision.enabled_for(np) is False


# ------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel,pad,stride,dilation", CONFIGS)
def test_cuda_im2col_col2im_match_generic(cp, kernel, pad, stride, dilation, dtype, rng):
    assert cuda_vision.available()
    shape = (3, 4, 9, 7)
    x = rng.standard_normal(shape).astype(dtype)
    cshape = col_shape(shape, kernel, pad, stride, dilation)
    (kh, kw), (ph, pw), (sh, sw), (dh, dw) = map(pair, (kernel, pad, stride, dilation))
    out_hw = (conv_out_size(shape[2], kh, ph, sh, dh), conv_out_size(shape[3], kw, pw, sw, dw))
    col_gpu = cp.full(cshape, 5.0, dtype=dtype)
    cuda_vision.im2col(cp.asarray(x), col_gpu, kernel, pad, stride, dilation, out_hw)
    np.testing.assert_array_equal(cp.asnumpy(col_gpu), im2col(x, kernel, pad, stride, dilation))
    # the generic code runs on CuPy arrays too
    np.testing.assert_array_equal(cp.asnumpy(im2col(cp.asarray(x), kernel, pad, stride,
                                                    dilation)), cp.asnumpy(col_gpu))

    c = rng.standard_normal(cshape).astype(dtype)
    img_gpu = cp.full(shape, 5.0, dtype=dtype)
    cuda_vision.col2im(cp.asarray(c), img_gpu, kernel, pad, stride, dilation, out_hw)
    ref = col2im(c.astype(np.float64), shape, kernel, pad, stride, dilation)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(cp.asnumpy(img_gpu), ref, rtol=tol, atol=tol)

    # the (C*kh*kw, N, OH*OW) layout
    col_t = cp.full(cshape[1::-1] + cshape[2:], 5.0, dtype=dtype)
    cuda_vision.im2col(cp.asarray(x), col_t, kernel, pad, stride, dilation, out_hw,
                       batch_major=False)
    np.testing.assert_array_equal(cp.asnumpy(col_t),
                                  im2col(x, kernel, pad, stride, dilation).transpose(1, 0, 2))
    c_t = np.ascontiguousarray(c.transpose(1, 0, 2))
    cuda_vision.col2im(cp.asarray(c_t), img_gpu, kernel, pad, stride, dilation, out_hw,
                       batch_major=False)
    np.testing.assert_allclose(cp.asnumpy(img_gpu), ref, rtol=tol, atol=tol)


@pytest.mark.gpu
def test_cuda_im2col_large_batch(cp, rng):
    """A batch whose column buffer exceeds one launch's grid (grid-stride loops)."""
    x = cp.asarray(rng.standard_normal((64, 16, 32, 32)).astype(np.float32))
    col = cp.empty(col_shape(x.shape, 3, 1, 1), dtype=np.float32)
    cuda_vision.im2col(x, col, 3, 1, 1, 1, (32, 32))
    np.testing.assert_array_equal(cp.asnumpy(col), cp.asnumpy(im2col(x, 3, 1, 1)))
    img = cp.empty_like(x)
    cuda_vision.col2im(col, img, 3, 1, 1, 1, (32, 32))
    ref = col2im(cp.asnumpy(col).astype(np.float64), x.shape, 3, 1, 1)
    np.testing.assert_allclose(cp.asnumpy(img), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(3, 5, 7), (96, 4, 3025), (2, 300, 1), (1, 1, 1)])
def test_cuda_swap_outer_transposes_and_adds_the_bias(cp, shape, dtype, rng):
    """(A, B, L) -> (B, A, L), with and without a bias per A: the convolution's passes
    between its GEMMs and its top (forward) and top diff (backward)."""
    src = rng.standard_normal(shape).astype(dtype)
    bias = rng.standard_normal(shape[0]).astype(dtype)
    out = cp.full((shape[1], shape[0], shape[2]), 7.0, dtype=dtype)
    cuda_vision.swap_outer(cp.asarray(src), out)
    np.testing.assert_array_equal(cp.asnumpy(out), src.transpose(1, 0, 2))
    cuda_vision.swap_outer(cp.asarray(src), out, cp.asarray(bias))
    np.testing.assert_array_equal(cp.asnumpy(out),
                                  src.transpose(1, 0, 2) + bias[None, :, None])
    with pytest.raises(ValueError, match="expected"):
        cuda_vision.swap_outer(cp.asarray(src),
                               cp.empty((shape[1] + 1, shape[0], shape[2]), dtype=dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel,pad,stride", [(3, 1, 1), (3, 0, 2), (5, 2, 1), (7, 3, 2),
                                               (11, 0, 4), (11, 2, 3)])
def test_cuda_fixed_size_lowering_is_the_generic_kernel(cp, kernel, pad, stride, dtype, rng,
                                                        monkeypatch):
    """The unrolled kernels for square 3/5/7/11 windows give the generic kernels' bits, in
    both column layouts (col2im sums in the same order)."""
    assert cuda_vision._fixed((kernel, kernel), (1, 1)) == kernel
    shape = (3, 2, 19, 23)
    x = cp.asarray(rng.standard_normal(shape).astype(dtype))
    out_hw = (conv_out_size(19, kernel, pad, stride, 1), conv_out_size(23, kernel, pad, stride, 1))
    cshape = col_shape(shape, kernel, pad, stride, 1)
    c = cp.asarray(rng.standard_normal(cshape).astype(dtype))
    for batch_major in (True, False):
        cs = cshape if batch_major else cshape[1::-1] + cshape[2:]
        cc = c if batch_major else cp.ascontiguousarray(c.transpose(1, 0, 2))
        got = [cuda_vision.im2col(x, cp.full(cs, 5.0, dtype=dtype), kernel, pad, stride, 1,
                                  out_hw, batch_major=batch_major),
               cuda_vision.col2im(cc, cp.full(shape, 5.0, dtype=dtype), kernel, pad, stride, 1,
                                  out_hw, batch_major=batch_major)]
        with monkeypatch.context() as m:
            m.setattr(cuda_vision, "_fixed", lambda kernel, dilation: None)
            ref = [cuda_vision.im2col(x, cp.empty(cs, dtype=dtype), kernel, pad, stride, 1,
                                      out_hw, batch_major=batch_major),
                   cuda_vision.col2im(cc, cp.empty(shape, dtype=dtype), kernel, pad, stride, 1,
                                      out_hw, batch_major=batch_major)]
        for g, r in zip(got, ref):
            np.testing.assert_array_equal(cp.asnumpy(g), cp.asnumpy(r))
    np.testing.assert_array_equal(cp.asnumpy(got[0]).transpose(1, 0, 2),
                                  im2col(cp.asnumpy(x), kernel, pad, stride, 1))
