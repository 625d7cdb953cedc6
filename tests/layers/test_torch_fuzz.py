"""Seeded differential fuzz of the CPU layers against PyTorch's float64 ops.

Each case is a tiny net (an Input layer and the layer under test, ``force_backward``) built
from prototxt text in float64, run forward and backward once; its tops, bottom diffs and param
diffs are compared with a reference written in torch and differentiated by autograd, within
1e-10 relative.  Parameters are drawn from numpy's ``default_rng`` seeded by SEED and the
layer's tag, so adding cases to one layer leaves the others' draws as they are; every case id
spells its parameters and a failure prints the whole net, so any case can be rebuilt by hand.

A second backward then checks Caffe's diff bookkeeping: bottom diffs are overwritten, param
diffs accumulate -- except a learned Scale's where Caffe's scale_layer.cpp writes it afresh.

Caffe's source is the spec, not torch: where the two differ the reference follows Caffe's loop
and says so (pooling's empty windows and clip rule, WITHIN_CHANNEL LRN's shift of 1, Eltwise
MAX's tie rule, SoftmaxWithLoss's FLT_MIN clamp, SigmoidCrossEntropyLoss's truncated
ignore_label test and default normalization, BatchNorm's blobs, that Scale param diff).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest

from minicaffe.net import TEST, TRAIN, Net
from minicaffe.proto import caffe_pb2, parse_text

torch = pytest.importorskip("torch")
F = torch.nn.functional

SEED = 20240611
FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)
RTOL = 1e-10


@dataclass
class Case:
    """One fuzzed layer.  ``reference(xs, ps)`` takes the bottoms and the layer's blobs
    (as they were before forward) as float64 tensors and returns the tops."""
    name: str                       # "<tag>-<index>"
    summary: str                    # the drawn parameters, for the test id
    layer: str                      # the layer block's body: type and params
    inputs: Callable                # rng -> list of bottom arrays
    reference: Callable
    grad: tuple = (0,)              # bottoms whose diffs are compared
    n_top: int = 1
    loss_weights: dict = field(default_factory=dict)  # top -> loss weight (loss tops)
    unread_tops: tuple = ()         # tops whose diff Caffe's backward never reads
    phase: int = TRAIN
    param_grads: bool = True        # compare the diffs of the layer's blobs
    blobs_before: Callable | None = None  # (rng, shapes) -> values written before forward
    blobs_after: Callable | None = None   # (xs, blobs before) -> expected blobs after forward
    in_place: bool = False
    overwritten_params: tuple = ()  # params whose diff Caffe overwrites instead of adding to

    @property
    def id(self):
        return f"{self.name}[{self.summary}]"


def _fmt(**kw):
    def one(v):
        if isinstance(v, (tuple, list, np.ndarray)):
            return "x".join(one(u) for u in v)
        if isinstance(v, (bool, np.bool_)):
            return str(int(v))
        if isinstance(v, (float, np.floating)):
            return f"{v:.3g}"
        return str(v)
    return ",".join(f"{k}={one(v)}" for k, v in kw.items())


def _f32(v):
    return float(np.float32(v))


def _real(rng, lo, hi):
    """A value for a float field of caffe.proto: three decimals, as the float32 the proto
    holds (and prints back, with %g, to the same float32)."""
    return _f32(round(float(rng.uniform(lo, hi)), 3))


def _dims(shape):
    return " ".join(f"dim: {int(d)}" for d in shape)


def _normal(*shapes):
    return lambda rng: [np.asarray(rng.standard_normal(s)) for s in shapes]


def _view(v, ndim, axis):
    """(S...) -> a view of v that broadcasts over an ndim array from ``axis`` on."""
    return v.reshape((1,) * axis + tuple(v.shape) + (1,) * (ndim - axis - v.dim()))


# ----------------------------------------------------------- Convolution / Deconvolution
def _spelled(rng, name, values, hw, default):
    """One of Caffe's spellings of a per-axis ConvolutionParameter field: left out (its
    default), one value for every axis, one value per axis, or ``<name>_h``/``<name>_w``."""
    values = [int(v) for v in values]
    if all(v == default for v in values) and rng.random() < 0.4:
        return ""
    if len(set(values)) == 1 and rng.random() < 0.5:
        return f"{name}: {values[0]}"
    if hw and len(values) == 2 and rng.random() < 0.5:
        base = "kernel" if name == "kernel_size" else name
        return f"{base}_h: {values[0]} {base}_w: {values[1]}"
    return " ".join(f"{name}: {v}" for v in values)


def conv_case(rng, name, deconv=False):
    nd = int(rng.choice([2] * 8 + [1, 3]))         # spatial axes
    axis = 2 if nd == 2 and rng.random() < 0.1 else 1
    g = int(rng.choice([1, 1, 2, 3]))
    cin, cout = g * int(rng.integers(1, 3)), g * int(rng.integers(1, 3))
    k = rng.integers(1, 5 if nd == 2 else 4, size=nd)
    s = rng.integers(1, 4, size=nd)
    p = rng.integers(0, 4, size=nd)
    d = rng.choice([1, 1, 2, 3], size=nd)
    if rng.random() < 0.15:                         # 1x1, often Caffe's is_1x1 shortcut
        k[:] = 1
        if rng.random() < 0.5:
            s[:], p[:], d[:] = 1, 0, 1
    ek = d * (k - 1) + 1
    if deconv:
        size = rng.integers(1, 5 if nd < 3 else 4, size=nd)
        # Caffe's output: stride * (in - 1) + kernel extent - 2 * pad, at least 1
        p = np.minimum(p, (s * (size - 1) + ek - 1) // 2)
    else:
        lo = np.maximum(1, ek - 2 * p)              # below ek: a kernel larger than the input
        size = lo + rng.integers(0, 5 if nd < 3 else 3, size=nd)
    bias = bool(rng.random() < 0.7)
    lead = (int(rng.integers(1, 3)),) * (axis - 1)
    shape = (int(rng.integers(1, 3)),) + lead + (cin,) + tuple(int(v) for v in size)
    spelled = axis - len(shape) if rng.random() < 0.2 else axis      # CanonicalAxisIndex
    nd_im2col = nd == 2 and rng.random() < 0.15       # Caffe's N-d lowering for 2 axes
    hw = nd == 2
    fields = " ".join(f for f in [
        _spelled(rng, "kernel_size", k, hw, None), _spelled(rng, "stride", s, hw, 1),
        _spelled(rng, "pad", p, hw, 0), _spelled(rng, "dilation", d, False, 1),
        "" if g == 1 and rng.random() < 0.5 else f"group: {g}",
        "" if spelled == 1 else f"axis: {spelled}",
        "force_nd_im2col: true" if nd_im2col else "",
        "" if bias and rng.random() < 0.5 else f"bias_term: {str(bias).lower()}"] if f)
    kind = "Deconvolution" if deconv else "Convolution"
    layer = (f'type: "{kind}" convolution_param {{ num_output: {cout} {fields} '
             'weight_filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" std: 1 } }')
    op = getattr(F, f"conv_transpose{nd}d" if deconv else f"conv{nd}d")
    kw = dict(stride=tuple(map(int, s)), padding=tuple(map(int, p)),
              dilation=tuple(map(int, d)), groups=g)

    def reference(xs, ps):
        x = xs[0].reshape((-1,) + xs[0].shape[axis:])     # axes before `axis` are batch
        y = op(x, ps[0], ps[1] if bias else None, **kw)
        return [y.reshape(xs[0].shape[:axis] + y.shape[1:])]

    summary = _fmt(k=k, s=s, p=p, d=d, g=g, o=cout, bias=bias, axis=spelled, nd=nd_im2col,
                   x=shape)
    return Case(name, summary, layer, _normal(shape), reference)


# ------------------------------------------------------------------------ Pooling
def caffe_pool(x, method, kernel, stride, pad, round_mode):
    """Caffe's PoolingLayer::Forward_cpu, window by window (vectorised over N and C), and
    the MAX mask (``h * W + w`` of the first maximum, -1 for an empty window).

    Output size: ceil (or floor) of (in + 2 pad - kernel) / stride, plus one; only when some
    pad is non-zero is a last window that starts at or past ``in + pad`` dropped.  Without
    padding Caffe keeps such a window although it holds no pixel (torch drops it): MAX gives
    -FLT_MAX with mask -1, AVE 0 / pool_size, whose pool_size is 0 or negative (NaN or -0).
    Caffe's MAX backward then adds the diff at bottom_diff[-1], outside the plane (undefined
    behaviour, in the previous channel or before the buffer); here, as in minicaffe, such a
    window passes no gradient.  AVE divides by the window clipped to the padded input.
    """
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (padh, padw) = kernel, stride, pad
    rnd = math.ceil if round_mode == "CEIL" else math.floor
    ph = rnd((h + 2 * padh - kh) / sh) + 1
    pw = rnd((w + 2 * padw - kw) / sw) + 1
    if padh or padw:
        if (ph - 1) * sh >= h + padh:
            ph -= 1
        if (pw - 1) * sw >= w + padw:
            pw -= 1
    rows, mask = [], np.full((n, c, ph, pw), -1.0)
    for i in range(ph):
        row = []
        for j in range(pw):
            hs, ws = i * sh - padh, j * sw - padw
            if method == "MAX":
                he, we = min(hs + kh, h), min(ws + kw, w)
                hs, ws = max(hs, 0), max(ws, 0)
                if he <= hs or we <= ws:
                    row.append(x.new_full((n, c), -FLT_MAX))
                    continue
                win = x[:, :, hs:he, ws:we].reshape(n, c, -1)
                row.append(win.amax(dim=2))
                r = win.detach().argmax(dim=2).numpy()      # the first maximum
                mask[:, :, i, j] = (hs + r // (we - ws)) * w + ws + r % (we - ws)
            else:
                he, we = min(hs + kh, h + padh), min(ws + kw, w + padw)
                pool_size = (he - hs) * (we - ws)
                hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
                total = x[:, :, hs:max(he, hs), ws:max(we, ws)].sum(dim=(2, 3))
                row.append(total / pool_size if pool_size else total * math.nan)
        rows.append(torch.stack(row, dim=-1))
    return torch.stack(rows, dim=-2), torch.from_numpy(mask)


def torch_pool(x, method, kernel, stride, pad, round_mode):
    """torch's pooling where it computes Caffe's numbers (no empty window, pad at most half
    the kernel, a kernel that fits the padded input), else None."""
    if any(p > k // 2 or n + 2 * p < k for n, p, k in zip(x.shape[2:], pad, kernel)):
        return None
    kw = dict(kernel_size=kernel, stride=stride, padding=pad, ceil_mode=round_mode == "CEIL")
    if method == "MAX":
        return F.max_pool2d(x, **kw)
    return F.avg_pool2d(x, count_include_pad=True, **kw)


def pool_case(rng, name):
    method = str(rng.choice(["MAX", "AVE"]))
    glob = bool(rng.random() < 0.12)
    k = rng.integers(1, 6, size=2)
    s = rng.integers(1, 5, size=2)
    p = np.where(rng.random(2) < 0.5, 0, rng.integers(0, 5, size=2) % k)   # pad < kernel
    round_mode = "FLOOR" if rng.random() < 0.15 else "CEIL"
    # from one below k - 2 pad: a kernel larger than the padded input (Caffe's ceil of a
    # negative quotient still gives one window, clipped to the input)
    size = np.maximum(1, k - 2 * p - 1) + rng.integers(0, 6, size=2)
    if round_mode == "FLOOR":
        size = np.maximum(size, k - 2 * p)   # else no window at all, which Caffe refuses
    size = np.where(s == 1, np.maximum(size, k - 2 * p), size)   # likewise
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4))) + tuple(int(v) for v in size)
    if glob:
        k, s, p = np.array(shape[2:]), np.array([1, 1]), np.array([0, 0])
        fields = "global_pooling: true"
    else:
        fields = " ".join([
            f"kernel_size: {k[0]}" if k[0] == k[1] and rng.random() < 0.5
            else f"kernel_h: {k[0]} kernel_w: {k[1]}",
            f"stride: {s[0]}" if s[0] == s[1] and rng.random() < 0.7
            else f"stride_h: {s[0]} stride_w: {s[1]}",
            "" if p[0] == p[1] == 0 and rng.random() < 0.5
            else f"pad: {p[0]}" if p[0] == p[1] and rng.random() < 0.7
            else f"pad_h: {p[0]} pad_w: {p[1]}"])
    if round_mode == "FLOOR" or rng.random() < 0.2:
        fields += f" round_mode: {round_mode}"
    n_top = 2 if method == "MAX" and rng.random() < 0.2 else 1
    geometry = (method, tuple(map(int, k)), tuple(map(int, s)), tuple(map(int, p)), round_mode)

    def reference(xs, ps):
        y, mask = caffe_pool(xs[0], *geometry)
        # the hand loop itself against torch, where torch computes Caffe's numbers (torch
        # drops an empty last window: its output is then smaller)
        ty = torch_pool(xs[0].detach(), *geometry)
        if ty is not None and ty.shape == y.shape:
            np.testing.assert_allclose(y.detach().numpy(), ty.numpy(), rtol=RTOL, atol=RTOL,
                                       err_msg="the hand loop is not torch's")
        return [y, mask][:n_top]

    summary = _fmt(pool=method, glob=glob, k=k, s=s, p=p, round=round_mode, tops=n_top,
                   x=shape)
    layer = f'type: "Pooling" pooling_param {{ pool: {method} {fields} }}'
    return Case(name, summary, layer, _normal(shape), reference, n_top=n_top,
                unread_tops=(1,) if n_top == 2 else ())


# -------------------------------------------------------------------- InnerProduct
def ip_case(rng, name):
    ndim = int(rng.integers(2, 5))
    shape = tuple(int(v) for v in rng.integers(1, 4, size=ndim))
    axis = int(rng.integers(0, ndim))
    spelled = axis - ndim if rng.random() < 0.3 else axis
    out = int(rng.integers(1, 6))
    transpose = bool(rng.random() < 0.5)
    bias = bool(rng.random() < 0.7)
    fields = f"num_output: {out}"
    if spelled != 1:
        fields += f" axis: {spelled}"
    if transpose or rng.random() < 0.2:
        fields += f" transpose: {str(transpose).lower()}"
    if not bias or rng.random() < 0.2:
        fields += f" bias_term: {str(bias).lower()}"
    layer = (f'type: "InnerProduct" inner_product_param {{ {fields} weight_filler {{ type: '
             '"gaussian" std: 1 } bias_filler { type: "gaussian" std: 1 } }')

    def reference(xs, ps):
        x = xs[0]
        m, kk = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
        w = ps[0] if transpose else ps[0].t()      # Caffe's weight: (K, N) with transpose
        y = x.reshape(m, kk) @ w
        if bias:
            y = y + ps[1]
        return [y.reshape(x.shape[:axis] + (out,))]

    summary = _fmt(o=out, axis=spelled, T=transpose, bias=bias, x=shape)
    return Case(name, summary, layer, _normal(shape), reference)


# ------------------------------------------------------------------------------ LRN
def lrn_case(rng, name):
    within = bool(rng.random() < 0.4)
    size = int(rng.choice([1, 3, 5] if within else [1, 3, 5, 7]))
    alpha = _real(rng, 0.05, 3)
    beta = _real(rng, 0.1, 1.5)
    k = _real(rng, 0.5, 3)
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 8)), int(rng.integers(1, 6)),
             int(rng.integers(1, 6)))
    region = "WITHIN_CHANNEL" if within else "ACROSS_CHANNELS"
    layer = (f'type: "LRN" lrn_param {{ local_size: {size} alpha: {alpha:g} beta: {beta:g} '
             f'k: {k:g} norm_region: {region} }}')

    def reference(xs, ps):
        x = xs[0]
        if not within:     # torch's formula is Caffe's for an odd size: k + alpha/n * sum
            return [F.local_response_norm(x, size, alpha=alpha, beta=beta, k=k)]
        # Caffe's WITHIN_CHANNEL sub-net (lrn_layer.cpp): square, AVE pooling (size, pad
        # (size-1)/2, stride 1: always divides by size^2), then Power with scale alpha and
        # shift 1 -- k is not used -- to the power -beta, times x
        pooled = F.avg_pool2d(x * x, size, stride=1, padding=(size - 1) // 2,
                              count_include_pad=True)
        return [x * (1 + alpha * pooled) ** -beta]

    summary = _fmt(region=region[:6], n=size, alpha=alpha, beta=beta, k=k, x=shape)
    return Case(name, summary, layer, _normal(shape), reference)


# ------------------------------------------------------------------------ BatchNorm
def bn_case(rng, name):
    ndim = int(rng.integers(1, 6))
    shape = [int(rng.integers(1, 4)) for _ in range(ndim)]
    c = shape[1] if ndim > 1 else 1                   # a 1-axis bottom is one channel
    if math.prod(shape) // c == 1 and rng.random() < 0.7:
        shape[0] = 2                                  # m = 1 now and then only
    shape = tuple(shape)
    m = math.prod(shape) // c
    phase = TRAIN if rng.random() < 0.6 else TEST
    ugs = rng.choice(["unset", "true", "false"])
    glob = (phase == TEST) if ugs == "unset" else ugs == "true"
    maf = _f32(rng.choice([0.999, _real(rng, 0.3, 1.0)]))
    eps = _f32(rng.choice([1e-5, 1e-3, 0.1]))
    zero_factor = glob and rng.random() < 0.15        # scale factor 0: mean 0, variance 0
    fields = "" if ugs == "unset" else f"use_global_stats: {ugs}"
    if maf != _f32(0.999):
        fields += f" moving_average_fraction: {maf:g}"
    if eps != _f32(1e-5) or rng.random() < 0.3:
        fields += f" eps: {eps:g}"
    layer = f'type: "BatchNorm" batch_norm_param {{ {fields} }}'

    def blobs_before(rng, shapes):
        factor = 0.0 if zero_factor else _real(rng, 0.5, 3)
        return [rng.standard_normal(c) * factor, rng.uniform(0.2, 2, c) * factor,
                np.array([factor])]

    def batch_stats(x):
        v = x.reshape(shape[0], c, -1)                    # (N, C, spatial)
        mean = v.mean(dim=(0, 2))
        return mean, ((v - mean[:, None]) ** 2).mean(dim=(0, 2))   # biased

    def reference(xs, ps):
        if glob:   # batch_norm_layer.cpp: the sums divided by the scale factor (0 if it is 0)
            f = 0.0 if float(ps[2][0]) == 0 else 1.0 / float(ps[2][0])
            mean, var = ps[0] * f, ps[1] * f
        else:
            mean, var = batch_stats(xs[0])
        v = xs[0].reshape(shape[0], c, -1)
        return [((v - mean[:, None]) / torch.sqrt(var[:, None] + eps)).reshape(shape)]

    def blobs_after(xs, ps):
        if glob:
            return ps
        # s <- maf * s + 1; sums <- batch value + maf * sum, the variance unbiased by m/(m-1)
        mean, var = (t.numpy() for t in batch_stats(torch.from_numpy(xs[0])))
        correction = m / (m - 1) if m > 1 else 1.0
        return [mean + maf * ps[0], var * correction + maf * ps[1], maf * ps[2] + 1]

    summary = _fmt(phase="TRAIN" if phase == TRAIN else "TEST", ugs=ugs, glob=glob, maf=maf,
                   eps=eps, x=shape)
    return Case(name, summary, layer, _normal(shape), reference, phase=phase,
                param_grads=False, blobs_before=blobs_before, blobs_after=blobs_after)


# ---------------------------------------------------------------------- Scale / Bias
def scale_case(rng, name, kind="Scale"):
    ndim = int(rng.integers(1, 5))
    shape = tuple(int(v) for v in rng.integers(1, 4, size=ndim))
    axis = int(rng.integers(0, ndim))
    spelled = axis - ndim if rng.random() < 0.3 else axis
    two = bool(rng.random() < 0.4)
    if two:
        n_axes = int(rng.integers(0, ndim - axis + 1))
        pshape = shape[axis:axis + n_axes]
        if n_axes == 0:
            axis = 0                   # a scalar second bottom: Caffe ignores the axis
        field_axes = None
    else:
        field_axes = int(rng.choice([-1] + list(range(0, ndim - axis + 1))))
        pshape = shape[axis:] if field_axes == -1 else shape[axis:axis + field_axes]
    bias = kind == "Scale" and bool(rng.random() < 0.5)
    param = "scale_param" if kind == "Scale" else "bias_param"
    fields = "" if spelled == 1 else f"axis: {spelled}"
    if field_axes is not None and (field_axes != 1 or rng.random() < 0.3):
        fields += f" num_axes: {field_axes}"
    if not two:
        fields += ' filler { type: "gaussian" std: 1 }'
    if bias:
        fields += ' bias_term: true bias_filler { type: "gaussian" std: 1 }'
    layer = f'type: "{kind}" {param} {{ {fields} }}'

    def reference(xs, ps):
        x = xs[0]
        v = xs[1] if two else ps[0]
        if kind == "Bias":
            return [x + _view(v, x.dim(), axis)]
        y = x * _view(v, x.dim(), axis)
        if bias:
            y = y + _view(ps[-1], x.dim(), axis)
        return [y]

    # scale_layer.cpp's Backward_cpu writes a learned scale's diff instead of adding to it
    # where outer_dim_ == 1, unless one scale value spans inner_dim_ > 1 elements
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + len(pshape):])
    if not pshape:
        outer, inner = 1, math.prod(shape)               # a scalar is applied at axis 0
    overwritten = (0,) if (kind == "Scale" and not two and outer == 1
                           and (math.prod(pshape) > 1 or inner == 1)) else ()
    summary = _fmt(axis=spelled, num_axes="-" if two else field_axes, two=two, bias=bias,
                   x=shape, p=pshape if pshape else "scalar")
    return Case(name, summary, layer, _normal(shape, pshape) if two else _normal(shape),
                reference, grad=(0, 1) if two else (0,), overwritten_params=overwritten)


# -------------------------------------------------------------------------- Eltwise
def eltwise_case(rng, name):
    op = str(rng.choice(["SUM", "PROD", "MAX"]))
    nb = int(rng.integers(2, 5))
    shape = tuple(int(v) for v in rng.integers(1, 4, size=int(rng.integers(1, 5))))
    coeffs = [_real(rng, -2, 2) for _ in range(nb)] if (
        op == "SUM" and rng.random() < 0.6) else None
    stable = bool(rng.random() < 0.7)
    ties = op == "MAX" and rng.random() < 0.5
    fields = f"operation: {op}"
    if coeffs:
        fields += "".join(f" coeff: {c:g}" for c in coeffs)
    if op == "PROD" and (not stable or rng.random() < 0.3):
        fields += f" stable_prod_grad: {str(stable).lower()}"

    def inputs(rng):
        if ties:                           # small integers: ties between bottoms
            return [rng.integers(-1, 2, size=shape).astype(float) for _ in range(nb)]
        if op == "PROD":                   # away from 0: dy * top / x is then exact enough
            return [rng.uniform(0.3, 2, shape) * rng.choice([-1, 1], shape) for _ in range(nb)]
        return [rng.standard_normal(shape) for _ in range(nb)]

    def reference(xs, ps):
        if op == "SUM":
            return [sum(x * (coeffs[i] if coeffs else 1.0) for i, x in enumerate(xs))]
        if op == "PROD":
            return [math.prod(xs[1:], start=xs[0])]
        # eltwise_layer.cpp: a tie between bottoms 0 and 1 goes to bottom 1 (it tests
        # x0 > x1), a later bottom wins only when strictly greater
        y = torch.where(xs[0] > xs[1], xs[0], xs[1])
        for x in xs[2:]:
            y = torch.where(x > y, x, y)
        return [y]

    summary = _fmt(op=op, n=nb, coeff=bool(coeffs), stable=stable, ties=ties, x=shape)
    return Case(name, summary, f'type: "Eltwise" eltwise_param {{ {fields} }}', inputs,
                reference, grad=tuple(range(nb)))


# ---------------------------------------------------------------- Softmax and losses
def softmax_case(rng, name):
    ndim = int(rng.integers(1, 5))
    shape = tuple(int(v) for v in rng.integers(1, 5, size=ndim))
    axis = int(rng.integers(0, ndim))
    spelled = axis - ndim if rng.random() < 0.4 else axis
    spread = float(rng.choice([1.0, 1.0, 40.0]))        # 40: exp() overflows unless shifted
    fields = "" if spelled == 1 else f"softmax_param {{ axis: {spelled} }}"
    return Case(name, _fmt(axis=spelled, spread=spread, x=shape), f'type: "Softmax" {fields}',
                lambda rng: [rng.standard_normal(shape) * spread],
                lambda xs, ps: [F.softmax(xs[0], dim=axis)])


NORMALIZATIONS = ["FULL", "VALID", "BATCH_SIZE", "NONE"]


def _normalization(rng, default):
    """(the mode Caffe uses, the fields that say it): the normalization field, the legacy
    normalize field (true: VALID, false: BATCH_SIZE), or neither (the layer's default)."""
    how = rng.choice(["field", "field", "legacy", "unset"])
    if how == "field":
        mode = str(rng.choice(NORMALIZATIONS))
        return mode, f"normalization: {mode}"
    if how == "legacy":
        normalize = bool(rng.random() < 0.5)
        return ("VALID" if normalize else "BATCH_SIZE"), f"normalize: {str(normalize).lower()}"
    return default, ""


def _normalizer(mode, outer, inner, valid):
    """LossLayer's get_normalizer: at least 1."""
    n = {"FULL": outer * inner, "VALID": valid, "BATCH_SIZE": outer, "NONE": 1}[mode]
    return max(1.0, float(n))


def softmax_loss_case(rng, name):
    ndim = int(rng.integers(2, 5))
    shape = tuple(int(v) for v in rng.integers(1, 4, size=ndim))
    axis = int(rng.integers(0, ndim))
    if axis == 0 and math.prod(shape[1:]) % shape[0]:
        axis = 1     # LossLayer::Reshape: the label's first axis is the data's
    spelled = axis - ndim if rng.random() < 0.4 else axis
    c = shape[axis]
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    lshape = shape[:axis] + ((1,) if rng.random() < 0.3 else ()) + shape[axis + 1:]
    if axis == 0:
        lshape = (shape[0], inner // shape[0])
    ignore = rng.choice([None, -1, int(rng.integers(0, c))])
    spread = float(rng.choice([1.0, 1.0, 1.0, 40.0]))   # 40: probabilities below FLT_MIN
    mode, loss_fields = _normalization(rng, "VALID")
    if ignore is not None:
        loss_fields += f" ignore_label: {ignore}"
    lw = float(rng.choice([1.0, _real(rng, 0.2, 3)]))
    n_top = 2 if rng.random() < 0.25 else 1
    fields = ""
    if spelled != 1:
        fields += f" softmax_param {{ axis: {spelled} }}"
    if loss_fields:
        fields += f" loss_param {{ {loss_fields} }}"
    if lw != 1.0 or n_top == 2:
        # with a second top Caffe needs a loss_weight per top: LossLayer::LayerSetUp adds
        # one (1) when none is given, and Layer::SetLossWeights then wants one per top
        fields += f" loss_weight: {lw:g}" + (" loss_weight: 0" if n_top == 2 else "")

    def inputs(rng):
        labels = rng.integers(0, c, size=lshape).astype(float)
        if ignore == -1:
            labels[rng.random(lshape) < 0.3] = -1
        return [rng.standard_normal(shape) * spread, labels]

    def reference(xs, ps):
        logp = F.log_softmax(xs[0], dim=axis).movedim(axis, -1).reshape(-1, c)
        label = xs[1].reshape(-1).long()
        valid = (label != ignore) if ignore is not None else torch.ones_like(label, dtype=bool)
        picked = logp.gather(1, label.clamp(0, c - 1)[:, None])[:, 0]
        # softmax_loss_layer.cpp: the loss is -log(max(prob, FLT_MIN)), its gradient
        # prob - onehot whether or not prob was clamped
        clamped = picked.exp().clamp_min(FLT_MIN).log()
        nll = -(picked + (clamped - picked).detach()) * valid
        norm = _normalizer(mode, outer, inner, int(valid.sum()))
        return [nll.sum() / norm, F.softmax(xs[0], dim=axis)][:n_top]

    summary = _fmt(axis=spelled, x=shape, label=lshape, ignore=ignore, norm=mode, lw=lw,
                   tops=n_top, spread=spread)
    return Case(name, summary, f'type: "SoftmaxWithLoss" {fields}', inputs, reference,
                n_top=n_top, loss_weights={0: lw}, unread_tops=(1,) if n_top == 2 else ())


def sigmoid_ce_case(rng, name):
    ndim = int(rng.integers(1, 5))
    shape = tuple(int(v) for v in rng.integers(1, 4, size=ndim))
    tshape = shape if rng.random() < 0.7 else (shape[0], -1)   # the same count will do
    binary = bool(rng.random() < 0.5)
    spread = float(rng.choice([2.0, 2.0, 40.0]))        # 40: exp(-x) overflows unless guarded
    ignore = rng.choice([None, -1, 0, 1])
    mode, loss_fields = _normalization(rng, "BATCH_SIZE")   # this layer's own default
    if ignore is not None:
        loss_fields += f" ignore_label: {ignore}"
    lw = float(rng.choice([1.0, _real(rng, 0.2, 3)]))
    fields = f" loss_param {{ {loss_fields} }}" if loss_fields else ""
    if lw != 1.0:
        fields += f" loss_weight: {lw:g}"

    def inputs(rng):
        t = (rng.integers(0, 2, size=shape) if binary else rng.uniform(0, 1, size=shape))
        t = t.astype(float)
        if ignore == -1:
            t[rng.random(shape) < 0.3] = -1
        return [rng.standard_normal(shape) * spread, t.reshape(tshape)]

    def reference(xs, ps):
        x, t = xs[0], xs[1].reshape(xs[0].shape)
        # sigmoid_cross_entropy_loss_layer.cpp compares static_cast<int>(target) with
        # ignore_label: a fractional target in (-1, 1) is ignored by ignore_label 0
        valid = (t.trunc() != ignore) if ignore is not None else torch.ones_like(t, dtype=bool)
        per = F.binary_cross_entropy_with_logits(x, t.clamp(0, 1), reduction="none")
        norm = _normalizer(mode, shape[0], math.prod(shape[1:]), int(valid.sum()))
        return [(per * valid).sum() / norm]

    summary = _fmt(x=shape, binary=binary, ignore=ignore, norm=mode, lw=lw, spread=spread)
    return Case(name, summary, f'type: "SigmoidCrossEntropyLoss" {fields}', inputs, reference,
                loss_weights={0: lw})


def euclidean_case(rng, name):
    shape = tuple(int(v) for v in rng.integers(1, 4, size=int(rng.integers(1, 5))))
    other = shape if rng.random() < 0.7 else (shape[0], math.prod(shape[1:]))
    lw = float(rng.choice([1.0, _real(rng, 0.2, 3)]))
    fields = f" loss_weight: {lw:g}" if lw != 1.0 else ""

    def reference(xs, ps):
        d = xs[0] - xs[1].reshape(xs[0].shape)
        return [(d * d).sum() / xs[0].shape[0] / 2]      # / num / 2, as Caffe

    return Case(name, _fmt(x=shape, b=other, lw=lw), f'type: "EuclideanLoss"{fields}',
                _normal(shape, other), reference, grad=(0, 1), loss_weights={0: lw})


# -------------------------------------------------------------------------- Neurons
def neuron_case(rng, name, kind):
    ndim = int(rng.integers(2 if kind == "PReLU" else 1, 5))
    shape = tuple(int(v) for v in rng.integers(1, 4, size=ndim))
    fields, summary = "", {}
    in_place = False
    data = "normal"                       # or "base": shift + scale * x kept positive
    if kind == "ReLU":
        slope = float(rng.choice([0.0, _real(rng, -0.5, 1.5)]))
        if slope:
            fields = f"relu_param {{ negative_slope: {slope:g} }}"
        in_place = slope >= 0 and rng.random() < 0.4   # Caffe's in place is exact then
        summary = dict(slope=slope)
        ref = lambda x, ps: torch.where(x > 0, x, x * slope)  # noqa: E731
    elif kind == "ELU":
        alpha = float(rng.choice([1.0, _real(rng, 0, 2)]))
        if alpha != 1.0:
            fields = f"elu_param {{ alpha: {alpha:g} }}"
        in_place = rng.random() < 0.4
        summary = dict(alpha=alpha)
        ref = lambda x, ps: torch.where(x > 0, x, alpha * torch.expm1(x))  # noqa: E731
    elif kind == "PReLU":
        shared = bool(rng.random() < 0.4)
        fields = ("prelu_param { filler { type: \"gaussian\" std: 1 }"
                  + (" channel_shared: true" if shared else "") + " }")
        in_place = rng.random() < 0.3
        summary = dict(shared=shared)

        def ref(x, ps):
            a = ps[0] if shared else _view(ps[0], x.dim(), 1)
            return torch.where(x > 0, x, x * a)
    elif kind == "Power":
        power = float(rng.choice([0.0, 1.0, 2.0, 3.0, -1.0, 0.5, _real(rng, -2, 3)]))
        scale = float(rng.choice([1.0, 0.0, _real(rng, -2, 2)]))
        shift = float(rng.choice([0.0, _real(rng, -1, 1)]))
        fields = f"power_param {{ power: {power:g} scale: {scale:g} shift: {shift:g} }}"
        # a positive base for a real power; any base for an integer power but -1
        data = "normal" if scale == 0 or power in (0.0, 1.0, 2.0, 3.0) else "base"
        summary = dict(power=power, scale=scale, shift=shift)

        def ref(x, ps):
            if scale == 0:       # Caffe sets the constant shift^power (1 for power 0)
                return torch.full_like(x, 1.0 if power == 0 else shift ** power)
            return (shift + scale * x) ** power
    elif kind == "Exp":
        base = float(rng.choice([-1.0, 2.0, _real(rng, 0.2, 4)]))
        scale = _real(rng, -1.5, 1.5)
        shift = float(rng.choice([0.0, _real(rng, -1, 1)]))
        fields = f"exp_param {{ base: {base:g} scale: {scale:g} shift: {shift:g} }}"
        in_place = rng.random() < 0.3            # backward reads the top only
        summary = dict(base=base, scale=scale, shift=shift)
        lb = 1.0 if base == -1 else math.log(base)
        ref = lambda x, ps: torch.exp(lb * (shift + scale * x))  # noqa: E731
    elif kind == "Log":
        base = float(rng.choice([-1.0, 10.0, _real(rng, 0.2, 4)]))
        scale = float(rng.choice([1.0, _real(rng, -2, 2)]))
        shift = float(rng.choice([0.0, _real(rng, -1, 1)]))
        fields = f"log_param {{ base: {base:g} scale: {scale:g} shift: {shift:g} }}"
        data = "base"
        summary = dict(base=base, scale=scale, shift=shift)
        lb = 1.0 if base == -1 else math.log(base)
        ref = lambda x, ps: torch.log(shift + scale * x) / lb  # noqa: E731
    else:
        in_place = kind in ("Sigmoid", "TanH") and rng.random() < 0.4
        ref = {"Sigmoid": lambda x, ps: torch.sigmoid(x),
               "TanH": lambda x, ps: torch.tanh(x),
               "BNLL": lambda x, ps: F.softplus(x),
               "AbsVal": lambda x, ps: torch.abs(x)}[kind]

    def inputs(rng):
        if data == "base":    # x with shift + scale * x in [0.2, 2.5]: a real power / log
            return [(rng.uniform(0.2, 2.5, shape) - shift) / scale]
        return [rng.standard_normal(shape) * 2]

    summary = _fmt(**summary, inplace=in_place, x=shape)
    return Case(name, summary, f'type: "{kind}" {fields}', inputs,
                lambda xs, ps: [ref(xs[0], ps)], in_place=in_place)


# ------------------------------------------------------------------ shapes and copies
def concat_case(rng, name):
    ndim = int(rng.integers(1, 5))
    shape = [int(v) for v in rng.integers(1, 4, size=ndim)]
    axis = int(rng.integers(0, ndim))
    nb = int(rng.integers(1, 5))
    shapes = [tuple(shape[:axis] + [int(rng.integers(1, 4))] + shape[axis + 1:])
              for _ in range(nb)]
    legacy = rng.random() < 0.2
    spelled = axis - ndim if not legacy and rng.random() < 0.4 else axis
    fields = (f"concat_param {{ concat_dim: {axis} }}" if legacy else
              "" if spelled == 1 else f"concat_param {{ axis: {spelled} }}")
    return Case(name, _fmt(axis=spelled, legacy=legacy, x="+".join("x".join(map(str, s))
                                                                    for s in shapes)),
                f'type: "Concat" {fields}', _normal(*shapes),
                lambda xs, ps: [torch.cat(xs, dim=axis)], grad=tuple(range(nb)))


def slice_case(rng, name):
    ndim = int(rng.integers(1, 5))
    shape = [int(v) for v in rng.integers(1, 4, size=ndim)]
    axis = int(rng.integers(0, ndim))
    shape[axis] = int(rng.integers(2, 7))
    length = shape[axis]
    if rng.random() < 0.6:
        points = sorted(int(v) for v in rng.choice(np.arange(1, length),
                                                   size=int(rng.integers(1, length)),
                                                   replace=False))
        sizes = np.diff([0] + points + [length]).tolist()
    else:                                     # no slice_point: equal parts
        n = int(rng.choice([d for d in range(1, length + 1) if length % d == 0]))
        points, sizes = [], [length // n] * n
    legacy = rng.random() < 0.2
    spelled = axis - ndim if not legacy and rng.random() < 0.4 else axis
    fields = (f"slice_dim: {axis}" if legacy else "" if spelled == 1 else f"axis: {spelled}")
    fields += "".join(f" slice_point: {p}" for p in points)
    return Case(name, _fmt(axis=spelled, legacy=legacy, points=points or "-", tops=len(sizes),
                           x=shape),
                f'type: "Slice" slice_param {{ {fields} }}', _normal(tuple(shape)),
                lambda xs, ps: list(torch.split(xs[0], sizes, dim=axis)), n_top=len(sizes))


def crop_case(rng, name):
    ndim = int(rng.integers(1, 5))
    axis = int(rng.integers(0, ndim))
    spelled = axis - ndim if rng.random() < 0.3 else axis
    ref_shape = [int(v) for v in rng.integers(1, 4, size=ndim)]
    how = rng.choice(["none", "one", "each"])
    n_off = {"none": 0, "one": 1, "each": ndim - axis}[how]
    offs = [int(v) for v in rng.integers(0, 3, size=n_off)]
    per_axis = [0] * (ndim - axis) if how == "none" else (
        offs * (ndim - axis) if how == "one" else offs)
    shape = list(ref_shape)
    for i, o in enumerate(per_axis):
        shape[axis + i] = ref_shape[axis + i] + o + int(rng.integers(0, 2))
    for i in range(axis):                     # axes before `axis` follow bottom 0
        shape[i] = int(rng.integers(1, 4))
    fields = ("" if spelled == 2 else f"axis: {spelled}") + "".join(
        f" offset: {o}" for o in offs)

    def reference(xs, ps):
        y = xs[0]
        for i, o in enumerate(per_axis):
            y = y.narrow(axis + i, o, ref_shape[axis + i])
        return [y]

    return Case(name, _fmt(axis=spelled, offset=offs or "-", x=shape, ref=ref_shape),
                f'type: "Crop" crop_param {{ {fields} }}', _normal(tuple(shape),
                                                                 tuple(ref_shape)),
                reference)


def flatten_case(rng, name):
    ndim = int(rng.integers(1, 5))
    shape = tuple(int(v) for v in rng.integers(1, 4, size=ndim))
    start = int(rng.integers(0, ndim))
    end = int(rng.integers(start, ndim))
    s_sp = start - ndim if rng.random() < 0.3 else start
    e_sp = end - ndim if rng.random() < 0.5 else end
    fields = ("" if s_sp == 1 else f"axis: {s_sp}") + ("" if e_sp == -1 else f" end_axis: {e_sp}")
    return Case(name, _fmt(axis=s_sp, end=e_sp, x=shape),
                f'type: "Flatten" flatten_param {{ {fields} }}', _normal(shape),
                lambda xs, ps: [torch.flatten(xs[0], start, end)])


def reshape_case(rng, name):
    ndim = int(rng.integers(1, 5))
    shape = [int(v) for v in rng.integers(1, 4, size=ndim)]
    start = int(rng.integers(0, ndim + 1))
    stop = int(rng.integers(start, ndim + 1))
    # the new dims of [start, stop): the count's factors, split at random
    count = math.prod(shape[start:stop])
    primes, rest = [], count
    for f in (2, 3):
        while rest % f == 0:
            primes.append(f)
            rest //= f
    primes += [1] * int(rng.integers(0, 2))          # now and then an axis of 1
    new = []
    for f in rng.permutation(primes):
        if new and rng.random() < 0.5:
            new[-1] *= int(f)
        else:
            new.append(int(f))
    spec = list(new)
    for i, d in enumerate(new):                # 0: copy the bottom's dim at that place
        if start + i < stop and d == shape[start + i] and rng.random() < 0.4:
            spec[i] = 0
    if spec and rng.random() < 0.5:
        spec[int(rng.integers(0, len(spec)))] = -1  # infer one dim
    top = shape[:start] + new + shape[stop:]
    # ReshapeLayer: a negative axis counts from the end, -1 being after the last axis
    axis_sp = start - ndim - 1 if rng.random() < 0.3 else start
    n_axes = stop - start if stop < ndim or rng.random() < 0.5 else -1
    fields = f"shape {{ {_dims(spec)} }}"
    if axis_sp != 0:
        fields += f" axis: {axis_sp}"
    if n_axes != -1:
        fields += f" num_axes: {n_axes}"
    return Case(name, _fmt(axis=axis_sp, num_axes=n_axes, shape=spec, x=shape),
                f'type: "Reshape" reshape_param {{ {fields} }}', _normal(tuple(shape)),
                lambda xs, ps: [xs[0].reshape(top)])


# ------------------------------------------------------------------------- the cases
def _draw(tag, n, make, *args):
    rng = np.random.default_rng([SEED, zlib.crc32(tag.encode())])
    return [make(rng, f"{tag}-{i:02d}", *args) for i in range(n)]


NEURONS = ["Sigmoid", "TanH", "ReLU", "ELU", "PReLU", "BNLL", "AbsVal", "Power", "Exp", "Log"]
CASES = (_draw("conv", 60, conv_case) + _draw("deconv", 50, conv_case, True)
         + _draw("pool", 80, pool_case) + _draw("ip", 30, ip_case) + _draw("lrn", 40, lrn_case)
         + _draw("bn", 40, bn_case) + _draw("scale", 50, scale_case)
         + _draw("bias", 20, scale_case, "Bias") + _draw("eltwise", 36, eltwise_case)
         + _draw("softmax", 20, softmax_case) + _draw("softmaxloss", 40, softmax_loss_case)
         + _draw("sigmoidce", 30, sigmoid_ce_case) + _draw("euclidean", 12, euclidean_case)
         + [c for kind in NEURONS for c in _draw(kind.lower(), 10, neuron_case, kind)]
         + _draw("concat", 15, concat_case) + _draw("slice", 15, slice_case)
         + _draw("crop", 20, crop_case) + _draw("flatten", 12, flatten_case)
         + _draw("reshape", 16, reshape_case))


# ---------------------------------------------------------------------------- the test
def net_text(case, xs):
    bottoms = [f"b{i}" for i in range(len(xs))]
    tops = bottoms[:1] if case.in_place else [f"t{i}" for i in range(case.n_top)]
    shapes = " ".join(f"shape {{ {_dims(x.shape)} }}" for x in xs)
    return "\n".join([
        f'name: "{case.name}" force_backward: true',
        'layer { name: "input" type: "Input" ' + " ".join(f'top: "{b}"' for b in bottoms)
        + f" input_param {{ {shapes} }} }}",
        'layer { name: "fuzzed" ' + " ".join(f'bottom: "{b}"' for b in bottoms) + " "
        + " ".join(f'top: "{t}"' for t in tops) + f" {case.layer} }}"]), bottoms, tops


def assert_close(what, got, want, text):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, Caffe's {want.shape}\n{text}"
    finite = np.abs(want[np.isfinite(want)])
    atol = RTOL * max(1.0, float(finite.max()) if finite.size else 1.0)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=atol, err_msg=f"{what} of\n{text}")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_layer_matches_torch(case):
    rng = np.random.default_rng([SEED, zlib.crc32(case.name.encode()), 1])
    xs = case.inputs(rng)
    text, bottoms, tops = net_text(case, xs)
    net = Net(parse_text(text, caffe_pb2.NetParameter, filename=f"<{case.name}>"), case.phase,
              mode="CPU", dtype=np.float64)
    layer = net.layers[net.layer_index("fuzzed")]
    for b, x in zip(bottoms, xs):
        net.blobs[b].data[...] = x
    if case.blobs_before is not None:
        for blob, v in zip(layer.blobs, case.blobs_before(rng, [b.shape for b in layer.blobs])):
            blob.data[...] = v
    before = [np.array(b.data, copy=True) for b in layer.blobs]
    net.forward()
    got_tops = [np.array(net.blobs[t].data, copy=True) for t in tops]
    dys = {}
    for i, t in enumerate(tops):
        if i not in case.loss_weights:       # a loss top's diff is its loss weight
            dys[i] = rng.standard_normal(net.blobs[t].shape)
            net.blobs[t].diff[...] = dys[i]
    net.clear_param_diffs()
    net.backward()
    for i, lw in case.loss_weights.items():        # set by the net, as Caffe's Net does
        assert float(net.blobs[tops[i]].diff) == _f32(lw), f"loss top {i}'s diff\n{text}"

    # the reference, differentiated by torch
    txs = [torch.tensor(x, requires_grad=i in case.grad) for i, x in enumerate(xs)]
    tps = [torch.tensor(p, requires_grad=case.param_grads) for p in before]
    want = case.reference(txs, tps)
    assert len(want) == len(tops)
    for i, (g, w) in enumerate(zip(got_tops, want)):
        assert_close(f"top {i}", g, w.detach().numpy(), text)
    if case.blobs_after is not None:
        for i, (blob, w) in enumerate(zip(layer.blobs, case.blobs_after(xs, before))):
            assert_close(f"blob {i} after forward", blob.data, w, text)
    objective = sum(w.sum() * case.loss_weights[i] if i in case.loss_weights
                    else (w * torch.from_numpy(dys[i]).reshape(w.shape)).sum()
                    for i, w in enumerate(want) if i not in case.unread_tops)
    targets = [txs[i] for i in case.grad] + (tps if case.param_grads else [])
    grads = (torch.autograd.grad(objective, targets, allow_unused=True)
             if torch.is_tensor(objective) and objective.requires_grad else [None] * len(targets))
    names = [f"bottom {i} diff" for i in case.grad] + [
        f"param {i} diff" for i in range(len(tps) if case.param_grads else 0)]
    got = [net.blobs[bottoms[i]].diff for i in case.grad] + [b.diff for b in layer.blobs
                                                             if case.param_grads]
    first = [np.array(g, copy=True) for g in got]
    for what, g, w, t in zip(names, got, grads, targets):
        assert_close(what, g, np.zeros(t.shape) if w is None else w.numpy(), text)

    # a second backward: Caffe overwrites bottom diffs and accumulates param diffs (but for
    # the case's overwritten_params)
    for i, dy in dys.items():
        net.blobs[tops[i]].diff[...] = dy
    net.backward()
    got = [net.blobs[bottoms[i]].diff for i in case.grad] + [b.diff for b in layer.blobs
                                                             if case.param_grads]
    adds = [False] * len(case.grad) + [i not in case.overwritten_params
                                       for i in range(len(got) - len(case.grad))]
    for what, g, f, add in zip(names, got, first, adds):
        assert_close(f"{what} after a second backward", g, 2 * f if add else f, text)
