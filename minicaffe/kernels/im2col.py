"""Batched im2col / col2im for 2-d (and N-d, at the end) convolution, one code path for
NumPy and CuPy.

Caffe lowers a convolution to a matrix product: ``im2col`` copies every
receptive field of an image into a column, so that the layer's weights
``(M, C*kh*kw)`` times the column buffer ``(C*kh*kw, OH*OW)`` is the output.
Caffe does that one image at a time; here a whole batch (or a chunk of it) is
lowered at once so that the product is one batched GEMM:

    x    (N, C, H, W)
    col  (N, C*kh*kw, OH*OW),  row index = (c*kh + i)*kw + j   (Caffe's order)
    col[n, (c*kh + i)*kw + j, oh*OW + ow] =
        x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]   (0 outside the image)

The row order is channel-major, so for a grouped convolution the rows of group
``g`` are the contiguous block ``g*(C/G)*kh*kw : (g+1)*(C/G)*kh*kw``.

With ``batch_major=False`` the buffer is laid out ``(C*kh*kw, N, OH*OW)``
instead: every row then holds the whole batch, so the weight gradient
``sum_n dtop[n] @ col[n].T`` is a single GEMM over ``N*OH*OW`` without copying
the (large) column buffer into another order.

``col2im`` is the adjoint (the sum of every column entry back into the pixel it
came from), used for the gradient with respect to the convolution's input.

Both are vectorized through strided views of a padded copy of the input:
im2col is one strided copy, col2im ``kh*kw`` strided additions (for one kernel
offset the targets are distinct, so the additions never alias).  The CUDA fast
path with the same contract is :mod:`minicaffe.kernels.cuda_vision`.
"""
from __future__ import annotations

from ..backend import get_array_module


def conv_out_size(size: int, kernel: int, pad: int, stride: int, dilation: int = 1) -> int:
    """Caffe's output extent ``(size + 2*pad - (dilation*(kernel-1)+1)) / stride + 1``.

    The division is C++ integer division, which truncates toward zero: when
    the padded input is a little smaller than the kernel's extent, Caffe still
    makes one output (its window reads zeros past the padding).
    """
    extent = dilation * (kernel - 1) + 1
    num = size + 2 * pad - extent
    q = abs(num) // stride
    return (q if num >= 0 else -q) + 1


def _pair(v):
    if isinstance(v, int):
        return v, v
    a, b = v
    return int(a), int(b)


def _geometry(h, w, kernel, pad, stride, dilation):
    kh, kw = _pair(kernel)
    ph, pw = _pair(pad)
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    oh = conv_out_size(h, kh, ph, sh, dh)
    ow = conv_out_size(w, kw, pw, sw, dw)
    if oh <= 0 or ow <= 0:
        raise ValueError(
            f"im2col: a {kh}x{kw} kernel (dilation {dh}x{dw}) does not fit a {h}x{w} input "
            f"padded by {ph}x{pw} (output would be {oh}x{ow})")
    # Rows/columns of the padded image that the windows touch: the padding, plus
    # the overhang that Caffe's truncating division can leave (read as zeros).
    hp = max(h + 2 * ph, (oh - 1) * sh + dh * (kh - 1) + 1)
    wp = max(w + 2 * pw, (ow - 1) * sw + dw * (kw - 1) + 1)
    return (kh, kw), (ph, pw), (sh, sw), (dh, dw), (oh, ow), (hp, wp)


def col_shape(x_shape, kernel, pad, stride, dilation=1, batch_major: bool = True) -> tuple:
    """Shape of the column buffer for an input of ``x_shape``: ``(N, C*kh*kw, OH*OW)``,
    or ``(C*kh*kw, N, OH*OW)`` when not ``batch_major``."""
    n, c, h, w = x_shape
    (kh, kw), _, _, _, (oh, ow), _ = _geometry(h, w, kernel, pad, stride, dilation)
    return (n, c * kh * kw, oh * ow) if batch_major else (c * kh * kw, n, oh * ow)


def _col_view(col, n, c, kh, kw, oh, ow, batch_major):
    """(N, C, kh, kw, OH, OW) view of a column buffer of either layout."""
    if batch_major:
        return col.reshape(n, c, kh, kw, oh, ow)
    return col.reshape(c, kh, kw, n, oh, ow).transpose(3, 0, 1, 2, 4, 5)


def im2col(x, kernel, pad=0, stride=1, dilation=1, out=None, batch_major: bool = True):
    """Lower a batch ``x`` (N, C, H, W) to columns (N, C*kh*kw, OH*OW).

    ``kernel``, ``pad``, ``stride`` and ``dilation`` are ints or (h, w) pairs.
    ``out``, when given, must be a C-contiguous array of the column shape;
    ``batch_major=False`` writes the layout (C*kh*kw, N, OH*OW).
    """
    xp = get_array_module(x)
    n, c, h, w = x.shape
    (kh, kw), (ph, pw), (sh, sw), (dh, dw), (oh, ow), (hp, wp) = _geometry(
        h, w, kernel, pad, stride, dilation)
    if out is None:
        out = xp.empty(col_shape(x.shape, kernel, pad, stride, dilation, batch_major),
                       dtype=x.dtype)
    if (hp, wp) == (h, w):
        src = x
    else:  # a zero frame around the image: (N, C, hp, wp)
        src = xp.zeros((n, c, hp, wp), dtype=x.dtype)
        src[:, :, ph:ph + h, pw:pw + w] = x
    s_n, s_c, s_h, s_w = src.strides
    # (N, C, kh, kw, OH, OW): element [.., i, j, oh, ow] = src[.., oh*sh + i*dh, ow*sw + j*dw]
    windows = xp.lib.stride_tricks.as_strided(
        src, shape=(n, c, kh, kw, oh, ow),
        strides=(s_n, s_c, dh * s_h, dw * s_w, sh * s_h, sw * s_w))
    _col_view(out, n, c, kh, kw, oh, ow, batch_major)[...] = windows
    return out


def col2im(col, x_shape, kernel, pad=0, stride=1, dilation=1, out=None,
           batch_major: bool = True):
    """Sum columns (N, C*kh*kw, OH*OW) back into images (N, C, H, W).

    The adjoint of :func:`im2col` (same ``batch_major`` layouts); ``out`` (if
    given) is overwritten, not accumulated into (Caffe's bottom diffs are
    overwritten).
    """
    xp = get_array_module(col)
    n, c, h, w = x_shape
    (kh, kw), (ph, pw), (sh, sw), (dh, dw), (oh, ow), (hp, wp) = _geometry(
        h, w, kernel, pad, stride, dilation)
    expected = (n, c * kh * kw, oh * ow) if batch_major else (c * kh * kw, n, oh * ow)
    if col.shape != expected:
        raise ValueError(f"col2im: columns of shape {col.shape} do not match images {x_shape} "
                         f"with a {kh}x{kw} kernel (expected {expected})")
    cols = _col_view(col, n, c, kh, kw, oh, ow, batch_major)
    acc = xp.zeros((n, c, hp, wp), dtype=col.dtype)
    for i in range(kh):
        r0 = i * dh
        for j in range(kw):
            c0 = j * dw
            # For one kernel offset the (oh, ow) targets are distinct pixels.
            rows = slice(r0, r0 + sh * (oh - 1) + 1, sh)
            acc[:, :, rows, c0:c0 + sw * (ow - 1) + 1:sw] += cols[:, :, i, j]
    if out is None:
        out = xp.empty((n, c, h, w), dtype=col.dtype)
    out[...] = acc[:, :, ph:ph + h, pw:pw + w]
    return out


# ------------------------------------------------------------------- N-d
# Caffe's im2col_nd / col2im_nd (``force_nd_im2col``, or a number of spatial axes other than
# two): the same lowering for D spatial axes,
#
#     x    (N, C, S1, ..., SD)
#     col  (N, C*K1*...*KD, O1*...*OD), row index = ((c*K1 + k1)*K2 + k2)... (Caffe's order)
#     col[n, row(c, k), o] = x[n, c, o1*s1 - p1 + k1*d1, ..., oD*sD - pD + kD*dD]
#
# with the same two layouts.  Through strided views as in 2-d; col2im_nd adds K1*...*KD
# strided slices.


def _geometry_nd(spatial, kernel, pad, stride, dilation):
    """(out extents, padded extents) per spatial axis, or an error like 2-d's."""
    outs, padded = [], []
    for s, k, p, st, d in zip(spatial, kernel, pad, stride, dilation):
        o = conv_out_size(s, k, p, st, d)
        if o <= 0:
            raise ValueError(
                f"im2col: a {'x'.join(map(str, kernel))} kernel (dilation "
                f"{'x'.join(map(str, dilation))}) does not fit a {'x'.join(map(str, spatial))} "
                f"input padded by {'x'.join(map(str, pad))}")
        outs.append(o)
        padded.append(max(s + 2 * p, (o - 1) * st + d * (k - 1) + 1))
    return tuple(outs), tuple(padded)


def _col_view_nd(col, n, c, kernel, outs, batch_major):
    """(N, C, K1..KD, O1..OD) view of a column buffer of either layout."""
    d = len(kernel)
    if batch_major:
        return col.reshape((n, c) + tuple(kernel) + tuple(outs))
    v = col.reshape((c,) + tuple(kernel) + (n,) + tuple(outs))
    return v.transpose((d + 1, 0) + tuple(range(1, d + 1)) + tuple(range(d + 2, 2 * d + 2)))


def col_shape_nd(x_shape, kernel, pad, stride, dilation, batch_major: bool = True) -> tuple:
    """Shape of the N-d column buffer: ``(N, C*prod(K), prod(O))``, or ``(C*prod(K), N,
    prod(O))`` when not ``batch_major``."""
    n, c = x_shape[:2]
    outs, _ = _geometry_nd(x_shape[2:], kernel, pad, stride, dilation)
    rows, cols = c * _prod(kernel), _prod(outs)
    return (n, rows, cols) if batch_major else (rows, n, cols)


def _prod(vals) -> int:
    out = 1
    for v in vals:
        out *= int(v)
    return out


def im2col_nd(x, kernel, pad, stride, dilation, out=None, batch_major: bool = True):
    """Lower a batch ``x`` (N, C, S1..SD) to columns (N, C*prod(K), prod(O)): Caffe's
    ``im2col_nd``.  ``kernel``, ``pad``, ``stride``, ``dilation``: one int per spatial axis."""
    xp = get_array_module(x)
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    if not len(spatial) == len(kernel) == len(pad) == len(stride) == len(dilation):
        raise ValueError(f"im2col: {len(spatial)} spatial axes in {x.shape} against kernel "
                         f"{kernel}, pad {pad}, stride {stride}, dilation {dilation}")
    outs, padded = _geometry_nd(spatial, kernel, pad, stride, dilation)
    if out is None:
        out = xp.empty(col_shape_nd(x.shape, kernel, pad, stride, dilation, batch_major),
                       dtype=x.dtype)
    if tuple(padded) == tuple(spatial):
        src = x
    else:
        src = xp.zeros((n, c) + padded, dtype=x.dtype)
        src[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(pad, spatial))] = x
    st = src.strides
    windows = xp.lib.stride_tricks.as_strided(
        src, shape=(n, c) + tuple(kernel) + outs,
        strides=st[:2] + tuple(dl * st[2 + i] for i, dl in enumerate(dilation))
        + tuple(sd * st[2 + i] for i, sd in enumerate(stride)))
    _col_view_nd(out, n, c, kernel, outs, batch_major)[...] = windows
    return out


def col2im_nd(col, x_shape, kernel, pad, stride, dilation, out=None, batch_major: bool = True):
    """Sum N-d columns back into images (N, C, S1..SD), overwriting ``out``: the adjoint of
    :func:`im2col_nd` (Caffe's ``col2im_nd``)."""
    import itertools
    xp = get_array_module(col)
    n, c = x_shape[:2]
    spatial = tuple(x_shape[2:])
    outs, padded = _geometry_nd(spatial, kernel, pad, stride, dilation)
    expected = col_shape_nd(x_shape, kernel, pad, stride, dilation, batch_major)
    if col.shape != expected:
        raise ValueError(f"col2im: columns of shape {col.shape} do not match images {x_shape} "
                         f"with a {'x'.join(map(str, kernel))} kernel (expected {expected})")
    cols = _col_view_nd(col, n, c, kernel, outs, batch_major)
    acc = xp.zeros((n, c) + padded, dtype=col.dtype)
    for k in itertools.product(*(range(kk) for kk in kernel)):
        # for one kernel offset the output positions hit distinct pixels
        target = tuple(slice(ki * dl, ki * dl + sd * (o - 1) + 1, sd)
                       for ki, dl, sd, o in zip(k, dilation, stride, outs))
        acc[(slice(None), slice(None)) + target] += cols[(slice(None), slice(None)) + k]
    if out is None:
        out = xp.empty((n, c) + spatial, dtype=col.dtype)
    out[...] = acc[(slice(None), slice(None)) + tuple(slice(p, p + s)
                                                       for p, s in zip(pad, spatial))]
    return out
