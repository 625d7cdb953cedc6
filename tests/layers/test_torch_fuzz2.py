"""Seeded differential fuzz of the layers test_torch_fuzz.py leaves out, against torch float64.

The same harness as tests/layers/test_torch_fuzz.py (imported, not copied): each case is a tiny
net from prototxt text (an Input layer and the layer under test, ``force_backward``), run
forward, backward and a second backward in float64 and compared with a reference written in
torch and differentiated by autograd, within 1e-10 relative.  Parameters are drawn from a
generator seeded by the harness's SEED and the layer's tag; each case id spells them.

Caffe's source is the spec, not torch.  Where a Caffe gradient is not the exact derivative the
reference reproduces Caffe's formula and says so: MVN's backward (eps treated as part of the
std), ContrastiveLoss's ``dist + 1e-4`` and the losses that clip at ``kLOG_THRESHOLD`` but
differentiate the unclipped log.  ArgMax and Accuracy tie rules are Caffe's loops
(``std::greater`` on (value, index) pairs; ``>=`` against the true class); Threshold, ArgMax
and Accuracy, which have no backward in Caffe, are checked on forward only, and what minicaffe
does when a gradient is asked of them is checked on its own.  LSTM and RNN are references
written by hand from Caffe's unrolled nets (lstm_layer.cpp, rnn_layer.cpp, lstm_unit_layer.cpp:
gate order i, f, o, g; the state scaled by cont_t; the exposed initial states get no gradient,
as Caffe shares only their data), not torch.nn.LSTM.  Dropout's TRAIN mask (minicaffe's
counter-based stream, not Caffe's) and SPP's STOCHASTIC levels (which sample in a TEST net too)
are checked for their rules rather than against a reference.

Where Caffe's CPU and GPU code disagree the fuzz stays where they agree or follows the CPU code,
as minicaffe does: LSTM's cont is drawn from {0, 1} (for other values the CPU's forget-gate
gradient uses the cont-scaled gate, the GPU's the exact one, which minicaffe follows), and
legacy ContrastiveLoss's dissimilar gradient is the CPU's -alpha (a - b) (the GPU kernel writes
-alpha without the (a - b)).

The second backward checks Caffe's bookkeeping as test_torch_fuzz.py does (bottom diffs
overwritten, param diffs accumulated).  One place where Caffe's own source does otherwise is
kept as minicaffe has it, on purpose: HingeLoss's Caffe backward turns the margins that its
forward left in bottom[0]'s diff into the gradient in place, so a second backward without a
forward in between reads its own gradient as margins; minicaffe recomputes the margins from
the data (the diff may not exist during forward under the memory planner), so both backwards
give Caffe's first one.  Likewise in-place MVN with normalize_variance: Caffe's backward
overwrites top_diff (it is bottom_diff) before it reads it again; the reference is the
out-of-place formula.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import test_torch_fuzz as fuzz  # noqa: E402  (tests/layers is on sys.path; the harness)
from minicaffe import rng as mc_rng  # noqa: E402
from minicaffe.io import array_to_blobproto, write_blobproto  # noqa: E402
from minicaffe.net import TEST, TRAIN, Net  # noqa: E402
from minicaffe.proto import caffe_pb2, parse_text  # noqa: E402

F = torch.nn.functional
Case, _fmt, _real, _normal = fuzz.Case, fuzz._fmt, fuzz._real, fuzz._normal
# Caffe's kLOG_THRESHOLD: ``const float kLOG_THRESHOLD = 1e-20`` used as Dtype: the float32
# value widened in a double net
LOG_THRESHOLD = float(np.float32(1e-20))
H_FILES: dict = {}     # case name -> the infogain matrix its layer reads from a file


def _shape(rng, lo, hi, ndim):
    return tuple(int(v) for v in rng.integers(lo, hi, size=ndim))


def _axis(rng, ndim, p_negative=0.3):
    """(axis, as spelled in the prototxt): Caffe's CanonicalAxisIndex takes -ndim..ndim-1."""
    axis = int(rng.integers(0, ndim))
    return axis, (axis - ndim if rng.random() < p_negative else axis)


def _trunc(t):
    """static_cast<int> of a float tensor: toward zero."""
    return t.detach().trunc().long()


# --------------------------------------------------------------------------------- Embed
def embed_case(rng, name):
    k = int(rng.integers(1, 7))                       # input_dim
    out = int(rng.integers(1, 5))
    shape = _shape(rng, 1, 4, int(rng.integers(1, 4)))
    bias = bool(rng.random() < 0.7)
    # a release build truncates a fractional index (static_cast<int>; the DCHECK that it is
    # an integer is compiled out): -0.5 picks row 0, K - 0.5 row K - 1
    frac = bool(rng.random() < 0.3)
    fields = f"num_output: {out} input_dim: {k}"
    if not bias or rng.random() < 0.3:
        fields += f" bias_term: {str(bias).lower()}"
    layer = (f'type: "Embed" embed_param {{ {fields} weight_filler {{ type: "gaussian" std: 1 }}'
             ' bias_filler { type: "gaussian" std: 1 } }')

    def inputs(rng):
        idx = rng.integers(0, k, size=shape).astype(float).reshape(-1)
        idx[0] = 0                                    # the edges of the table
        idx[-1] = k - 1
        if frac:
            idx += rng.uniform(0, 0.99, idx.shape)
            idx[rng.random(idx.shape) < 0.2] = -0.5
        return [idx.reshape(shape)]

    def reference(xs, ps):
        y = ps[0][_trunc(xs[0])]                      # (..., num_output); repeats add up
        return [y + ps[1] if bias else y]

    return Case(name, _fmt(K=k, o=out, bias=bias, frac=frac, x=shape), layer, inputs, reference,
                grad=())                              # no gradient to the indices


# -------------------------------------------------------------------------------- ArgMax
def argmax_case(rng, name):
    ndim = int(rng.integers(1, 5))
    shape = _shape(rng, 1, 5, ndim)
    has_axis = ndim > 1 and rng.random() < 0.6 or ndim == 1 and rng.random() < 0.5
    if has_axis:
        axis, spelled = _axis(rng, ndim)
        outer, dim, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    else:
        outer, dim, inner = shape[0], math.prod(shape[1:]), 1
    top_k = 1 if rng.random() < 0.4 else int(rng.integers(1, dim + 1))
    out_max_val = bool(rng.random() < 0.5)
    ties = bool(rng.random() < 0.5)
    fields = f"top_k: {top_k}" if top_k != 1 or rng.random() < 0.3 else ""
    if out_max_val:
        fields += " out_max_val: true"
    if has_axis:
        fields += f" axis: {spelled}"

    def inputs(rng):
        if ties:                                      # few values: ties within a row
            return [rng.integers(-1, 2, size=shape).astype(float)]
        return [rng.standard_normal(shape)]

    def reference(xs, ps):
        # argmax_layer.cpp: std::partial_sort of (value, index) pairs with std::greater, so
        # equal values rank the larger index first
        v = xs[0].detach().numpy().reshape(outer, dim, inner)
        j = np.arange(dim)
        idx = np.empty((outer, top_k, inner), dtype=np.int64)
        for o in range(outer):
            for i in range(inner):
                idx[o, :, i] = np.lexsort((-j, -v[o, :, i]))[:top_k]
        vals = np.take_along_axis(v, idx, axis=1)
        if has_axis:
            top = (vals if out_max_val else idx).reshape(
                shape[:axis] + (top_k,) + shape[axis + 1:])
        else:    # (N, 1 or 2, top_k) padded with 1s to the bottom's axes (at least 3)
            top = np.concatenate([idx, vals] if out_max_val else [idx], axis=1)
            top = top.reshape((outer, 2 if out_max_val else 1, top_k)
                              + (1,) * (max(ndim, 3) - 3))
        return [torch.from_numpy(top.astype(float))]

    summary = _fmt(axis=spelled if has_axis else "-", k=top_k, max_val=out_max_val, ties=ties,
                   x=shape)
    return Case(name, summary, f'type: "ArgMax" argmax_param {{ {fields} }}', inputs,
                reference, grad=())


# ------------------------------------------------------------------------------ Accuracy
def accuracy_case(rng, name):
    ndim = int(rng.integers(2, 5))
    shape = _shape(rng, 1, 5, ndim)
    axis, spelled = _axis(rng, ndim)
    c = shape[axis]
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    lshape = shape[:axis] + shape[axis + 1:] if rng.random() < 0.6 else (outer * inner,)
    top_k = 1 if rng.random() < 0.4 else int(rng.integers(1, c + 1))
    ignore = rng.choice([None, None, -1, int(rng.integers(0, c))])
    two = bool(rng.random() < 0.4)                    # the per-class accuracies
    ties = bool(rng.random() < 0.5)
    frac = bool(rng.random() < 0.25)                  # labels are cast with static_cast<int>
    fields = "" if spelled == 1 else f"axis: {spelled}"
    if top_k != 1 or rng.random() < 0.3:
        fields += f" top_k: {top_k}"
    if ignore is not None:
        fields += f" ignore_label: {ignore}"

    def inputs(rng):
        x = (rng.integers(-1, 2, size=shape).astype(float) if ties
             else rng.standard_normal(shape))
        labels = rng.integers(0, c, size=lshape).astype(float)
        if frac:
            labels += rng.uniform(0, 0.99, lshape)
        if ignore == -1:      # -1.5 is cast to -1 too
            labels[rng.random(lshape) < 0.3] = rng.choice([-1.0, -1.5])
        return [x, labels]

    def reference(xs, ps):
        # accuracy_layer.cpp: a position counts when fewer than top_k classes score >= the
        # true class's score, the true class itself not counted (the count starts at -1)
        x = xs[0].detach().numpy().reshape(outer, c, inner)
        lab = _trunc(xs[1]).numpy().reshape(outer, inner)
        valid = lab != ignore if ignore is not None else np.ones(lab.shape, bool)
        safe = np.where(valid, lab, 0)
        true = np.take_along_axis(x, safe[:, None, :], axis=1)
        correct = ((x >= true).sum(axis=1) - 1 < top_k) & valid
        acc = correct.sum() / valid.sum() if valid.sum() else 0.0
        tops = [torch.tensor(float(acc), dtype=torch.float64)]
        if two:     # per class: hits / count of the class, 0 for a class with no label
            nums = np.array([(valid & (lab == k)).sum() for k in range(c)])
            hits = np.array([(correct & (lab == k)).sum() for k in range(c)])
            tops.append(torch.from_numpy(np.where(nums == 0, 0.0, hits / np.maximum(nums, 1))))
        return tops

    summary = _fmt(axis=spelled, k=top_k, ignore=ignore, tops=2 if two else 1, ties=ties,
                   frac=frac, x=shape, label=lshape)
    return Case(name, summary, f'type: "Accuracy" accuracy_param {{ {fields} }}', inputs,
                reference, grad=(), n_top=2 if two else 1)


# ----------------------------------------------------------------------------- Reduction
def reduction_case(rng, name):
    ndim = int(rng.integers(1, 5))
    shape = _shape(rng, 1, 4, ndim)
    axis, spelled = _axis(rng, ndim)
    op = str(rng.choice(["SUM", "ASUM", "SUMSQ", "MEAN"]))
    coeff = float(rng.choice([1.0, 1.0, 0.0, _real(rng, -2, 2)]))
    fields = "" if op == "SUM" and rng.random() < 0.5 else f"operation: {op}"
    if spelled != 0:
        fields += f" axis: {spelled}"
    if coeff != 1.0:
        fields += f" coeff: {coeff:g}"
    dim = math.prod(shape[axis:])

    def inputs(rng):
        x = rng.standard_normal(shape)
        x[rng.random(shape) < 0.2] = 0.0              # ASUM's sign(0) = 0
        return [x]

    def reference(xs, ps):
        x = xs[0].reshape(shape[:axis] + (dim,))
        if op in ("SUM", "MEAN"):
            y = x.sum(-1)
        elif op == "ASUM":
            y = x.abs().sum(-1)
        else:
            y = (x * x).sum(-1)
        # reduction_layer.cpp folds MEAN's 1/dim into coeff_ (a Dtype): coeff_ /= dim_
        return [y * (coeff / dim if op == "MEAN" else coeff)]

    return Case(name, _fmt(op=op, axis=spelled, coeff=coeff, x=shape),
                f'type: "Reduction" reduction_param {{ {fields} }}', inputs, reference)


# ---------------------------------------------------------------------------------- Tile
def tile_case(rng, name):
    ndim = int(rng.integers(1, 5))
    shape = _shape(rng, 1, 4, ndim)
    axis, spelled = _axis(rng, ndim)
    tiles = int(rng.integers(1, 5))
    fields = f"tiles: {tiles}" + ("" if spelled == 1 else f" axis: {spelled}")
    return Case(name, _fmt(axis=spelled, tiles=tiles, x=shape),
                f'type: "Tile" tile_param {{ {fields} }}', _normal(shape),
                lambda xs, ps: [torch.cat([xs[0]] * tiles, dim=axis)])


# ----------------------------------------------------------------------------------- MVN
class CaffeMVN(torch.autograd.Function):
    """mvn_layer.cpp on rows (R, D): y = (x - mean) / (std + eps), std the population std.
    Backward is Caffe's formula dx = (dy - mean(dy) - y * mean(dy * y)) / (std + eps), which
    is the exact gradient only as eps -> 0 (it differentiates std as if it were std + eps)."""

    @staticmethod
    def forward(ctx, x, eps):
        xc = x - x.mean(dim=1, keepdim=True)
        s = (xc * xc).mean(dim=1, keepdim=True).sqrt() + eps
        y = xc / s
        ctx.save_for_backward(y, s)
        return y

    @staticmethod
    def backward(ctx, dy):
        y, s = ctx.saved_tensors
        dx = dy - dy.mean(dim=1, keepdim=True) - y * (y * dy).mean(dim=1, keepdim=True)
        return dx / s, None


def mvn_case(rng, name):
    ndim = int(rng.integers(1, 5))
    shape = _shape(rng, 1, 4, ndim)
    if math.prod(shape[1:]) == 1 and rng.random() < 0.7:
        shape = shape[:1] + (3,) + shape[2:] if ndim > 1 else shape
    normalize = bool(rng.random() < 0.7)
    across = bool(rng.random() < 0.4)
    eps = _f32(rng.choice([1e-9, 1e-3, 0.1, 1.0]))
    fields = "" if normalize and rng.random() < 0.5 else \
        f"normalize_variance: {str(normalize).lower()}"
    if across or rng.random() < 0.2:
        fields += f" across_channels: {str(across).lower()}"
    if eps != _f32(1e-9) or rng.random() < 0.2:
        fields += f" eps: {eps:g}"
    legacy = tuple(shape[i] if i < ndim else 1 for i in range(4))   # Caffe's (N, C, H, W)
    rows = legacy[0] if across else legacy[0] * legacy[1]
    # In place (a 4-axis bottom: the top is reshaped to 4 axes) the reference is still the
    # out-of-place formula.  Caffe's own in-place normalize_variance backward is broken: its
    # first caffe_mul writes y * dy into bottom_diff, which is top_diff, and the later sum of
    # top_diff and caffe_cpu_axpby(top_diff, bottom_diff) read that; minicaffe does not
    # reproduce it.
    in_place = ndim == 4 and bool(rng.random() < 0.3)

    def reference(xs, ps):
        x = xs[0].reshape(rows, -1)
        y = CaffeMVN.apply(x, eps) if normalize else x - x.mean(dim=1, keepdim=True)
        return [y.reshape(legacy)]

    return Case(name, _fmt(norm=normalize, across=across, eps=eps, inplace=in_place, x=shape),
                f'type: "MVN" mvn_param {{ {fields} }}', _normal(shape), reference,
                in_place=in_place)


def _f32(v):
    return float(np.float32(v))


# --------------------------------------------------------------------- Threshold / Clip
def threshold_case(rng, name):
    shape = _shape(rng, 1, 4, int(rng.integers(1, 5)))
    t = float(rng.choice([0.0, _real(rng, -1, 1)]))
    fields = "" if t == 0 and rng.random() < 0.5 else f"threshold_param {{ threshold: {t:g} }}"

    def inputs(rng):        # x == threshold gives 0 (Caffe: x > threshold)
        x = rng.standard_normal(shape)
        x[rng.random(shape) < 0.3] = t
        return [x]

    return Case(name, _fmt(t=t, x=shape), f'type: "Threshold" {fields}', inputs,
                lambda xs, ps: [(xs[0] > t).double()], grad=())


def clip_case(rng, name):
    shape = _shape(rng, 1, 4, int(rng.integers(1, 5)))
    lo, hi = sorted([_real(rng, -1.5, 1.5), _real(rng, -1.5, 1.5)])
    if rng.random() < 0.15:
        lo, hi = hi, lo                               # min > max: Caffe gives min
    in_place = bool(rng.random() < 0.3)

    def inputs(rng):
        x = rng.standard_normal(shape) * 1.5
        pick = rng.random(shape)
        x[pick < 0.15] = lo                           # the bounds themselves pass the gradient
        x[pick > 0.85] = hi
        return [x]

    def reference(xs, ps):
        x = xs[0]
        # clip_layer.cpp: max(min, min(x, max)); backward passes dy where min <= x <= max,
        # reading bottom[0]'s data, which in place is the clipped top
        y = torch.maximum(torch.minimum(x.detach(), torch.tensor(hi)), torch.tensor(lo))
        seen = y if in_place else x.detach()
        mask = (seen >= lo) & (seen <= hi)
        return [y + mask * (x - x.detach())]

    return Case(name, _fmt(min=lo, max=hi, inplace=in_place, x=shape),
                f'type: "Clip" clip_param {{ min: {lo:g} max: {hi:g} }}', inputs, reference,
                in_place=in_place)


def swish_case(rng, name):
    shape = _shape(rng, 1, 4, int(rng.integers(1, 5)))
    beta = float(rng.choice([1.0, 0.0, _real(rng, -2, 3), _real(rng, 0.1, 3)]))
    in_place = bool(rng.random() < 0.3)               # backward reads the top and s only
    fields = "" if beta == 1 and rng.random() < 0.5 else f"swish_param {{ beta: {beta:g} }}"
    return Case(name, _fmt(beta=beta, inplace=in_place, x=shape), f'type: "Swish" {fields}',
                lambda rng: [rng.standard_normal(shape) * 2],
                lambda xs, ps: [xs[0] * torch.sigmoid(beta * xs[0])], in_place=in_place)


# ----------------------------------------------------------------------------------- SPP
def spp_geometry(level, h, w):
    """spp_layer.cpp's GetPoolingParam: bins = 2^level per axis, kernel = ceil(size / bins),
    stride = kernel, pad = (kernel * bins - size + 1) / 2."""
    bins = 2 ** level
    kh, kw = math.ceil(h / bins), math.ceil(w / bins)
    return (kh, kw), (kh, kw), ((kh * bins - h + 1) // 2, (kw * bins - w + 1) // 2)


def spp_case(rng, name):
    method = str(rng.choice(["MAX", "AVE"]))
    while True:   # Caffe's pooling refuses a level whose pad is not below its kernel
        levels = int(rng.integers(1, 5))
        h, w = int(rng.integers(1, 13)), int(rng.integers(1, 13))
        geo = [spp_geometry(lv, h, w) for lv in range(levels)]
        if all(p[0] < k[0] and p[1] < k[1] for k, s, p in geo):
            break
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4)), h, w)
    fields = f"pyramid_height: {levels}"
    if method == "AVE" or rng.random() < 0.3:
        fields += f" pool: {method}"

    def reference(xs, ps):
        # each level is Caffe's CAFFE-engine pooling (the hand loop of test_torch_fuzz.py),
        # then Flatten and Concat along axis 1; one level is that pooling's own (N, C, 1, 1)
        ys = [fuzz.caffe_pool(xs[0], method, k, s, p, "CEIL")[0] for k, s, p in geo]
        if levels == 1:
            return ys
        return [torch.cat([y.reshape(shape[0], -1) for y in ys], dim=1)]

    return Case(name, _fmt(pool=method, L=levels, x=shape), f'type: "SPP" spp_param {{ {fields} }}',
                _normal(shape), reference)


# -------------------------------------------------------------------------------- Im2col
def caffe_im2col(x, axis, kernel, stride, pad, dilation):
    """im2col_layer.cpp (im2col_cpu / im2col_nd_cpu per image): (lead..., C, S1..SD) ->
    (lead..., C*K1*...*KD, O1..OD), rows ordered channel, then kernel offsets (first axis
    major), zeros outside the image.  O = (S + 2p - (d(k-1)+1)) / s + 1 in C++'s truncating
    division: a padded input a little smaller than the kernel still gives one output."""
    lead, c, size = x.shape[:axis], x.shape[axis], x.shape[axis + 1:]
    ek = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    out = [int((n + 2 * p - e) / s) + 1 for n, p, e, s in zip(size, pad, ek, stride)]
    xb = x.reshape((-1, c) + tuple(size))
    pads = []
    for n, p, e, s, o in reversed(list(zip(size, pad, ek, stride, out))):
        pads += [p, max(p, (o - 1) * s + e - n - p)]   # room for every window's last tap
    xp = F.pad(xb, pads)
    cols = []
    for offs in itertools.product(*[range(k) for k in kernel]):
        index = (slice(None), slice(None)) + tuple(
            slice(i * d, i * d + (o - 1) * s + 1, s)
            for i, d, o, s in zip(offs, dilation, out, stride))
        cols.append(xp[index])                          # (B, C, O1..OD)
    col = torch.stack(cols, dim=2)                      # (B, C, K, O1..OD)
    return col.reshape(tuple(lead) + (c * math.prod(kernel),) + tuple(out))


def im2col_case(rng, name):
    nd = int(rng.choice([2] * 6 + [1, 3]))
    axis = 2 if nd == 2 and rng.random() < 0.15 else 1
    k = rng.integers(1, 5 if nd < 3 else 3, size=nd)
    s = rng.integers(1, 4, size=nd)
    p = rng.integers(0, 3, size=nd)
    d = rng.choice([1, 1, 2], size=nd)
    ek = d * (k - 1) + 1
    # from ek - 2p - (s - 1): Caffe's truncating division gives one output for a padded input
    # up to s - 1 smaller than the kernel's extent
    lo = np.maximum(1, ek - 2 * p - (s - 1))
    size = lo + rng.integers(0, 4 if nd < 3 else 2, size=nd)
    lead = (int(rng.integers(1, 3)),) * axis
    shape = lead + (int(rng.integers(1, 3)),) + tuple(int(v) for v in size)
    spelled = axis - len(shape) if rng.random() < 0.2 else axis
    hw = nd == 2
    fields = " ".join(f for f in [
        fuzz._spelled(rng, "kernel_size", k, hw, None), fuzz._spelled(rng, "stride", s, hw, 1),
        fuzz._spelled(rng, "pad", p, hw, 0), fuzz._spelled(rng, "dilation", d, False, 1),
        "" if spelled == 1 else f"axis: {spelled}",
        "force_nd_im2col: true" if nd == 2 and rng.random() < 0.15 else ""] if f)
    geometry = tuple(tuple(int(v) for v in a) for a in (k, s, p, d))

    def reference(xs, ps):
        y = caffe_im2col(xs[0], axis, *geometry)
        if nd == 2 and all(n + 2 * pp >= e for n, pp, e in zip(size, p, ek)):
            # the hand lowering against torch's where both are defined
            kk, ss, pp, dd = geometry
            t = F.unfold(xs[0].detach().reshape((-1,) + shape[axis:]), kk, dilation=dd,
                         padding=pp, stride=ss)
            np.testing.assert_allclose(y.detach().numpy().reshape(-1), t.numpy().reshape(-1),
                                       rtol=0, atol=0, err_msg="the hand lowering is not torch's")
        return [y]

    summary = _fmt(k=k, s=s, p=p, d=d, axis=spelled, x=shape)
    return Case(name, summary, f'type: "Im2col" convolution_param {{ {fields} }}',
                _normal(shape), reference)


# ------------------------------------------------------------------------- Hinge loss
def _loss_weight(rng):
    lw = float(rng.choice([1.0, _real(rng, 0.2, 3)]))
    return lw, (f" loss_weight: {lw:g}" if lw != 1.0 else "")


def hinge_case(rng, name):
    n, c = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    shape = (n, c) if rng.random() < 0.6 else (n, c) + _shape(rng, 1, 3, 2)
    dim = math.prod(shape[1:])
    norm = str(rng.choice(["L1", "L2"]))
    lw, lw_field = _loss_weight(rng)
    lshape = (n,) if rng.random() < 0.6 else (n, 1)
    fields = "" if norm == "L1" and rng.random() < 0.5 else f"hinge_loss_param {{ norm: {norm} }}"

    frac = bool(rng.random() < 0.3)                   # labels cast with static_cast<int>

    def inputs(rng):
        x = rng.standard_normal(shape) * 1.5
        x[rng.random(shape) < 0.15] = rng.choice([-1.0, 1.0])   # margins of exactly 0
        return [x, rng.integers(0, dim, size=lshape) + (rng.uniform(0, 0.99, lshape) * frac)]

    def reference(xs, ps):
        # hinge_loss_layer.cpp: t = +1 at the label, -1 elsewhere; sum max(0, 1 - t x)
        # (or its square) / N; the subgradient at a zero margin is 0 (caffe_cpu_sign)
        x = xs[0].reshape(n, dim)
        t = -torch.ones(n, dim, dtype=x.dtype)
        t[torch.arange(n), _trunc(xs[1]).reshape(n)] = 1
        m = F.relu(1 - t * x)
        return [(m.sum() if norm == "L1" else (m * m).sum()) / n]

    return Case(name, _fmt(norm=norm, x=shape, label=lshape, frac=frac, lw=lw),
                f'type: "HingeLoss" {fields}{lw_field}', inputs, reference,
                loss_weights={0: lw})


# --------------------------------------------------------------------- Contrastive loss
def contrastive_case(rng, name):
    n, c = int(rng.integers(1, 6)), int(rng.integers(1, 5))
    shape = (n, c) if rng.random() < 0.7 else (n, c, 1, 1)
    lshape = (n,) if rng.random() < 0.7 else (n, 1, 1, 1)
    legacy = bool(rng.random() < 0.5)
    margin = float(rng.choice([1.0, _real(rng, 0.2, 4)]))
    lw, lw_field = _loss_weight(rng)
    fields = []
    if margin != 1.0:
        fields.append(f"margin: {margin:g}")
    if legacy or rng.random() < 0.3:
        fields.append(f"legacy_version: {str(legacy).lower()}")
    text = f" contrastive_loss_param {{ {' '.join(fields)} }}" if fields else ""

    def inputs(rng):
        a, b = rng.standard_normal(shape), rng.standard_normal(shape) * 0.7
        # y is cast with static_cast<int>: 0.6 and -0.7 are dissimilar, 1 and 2 similar
        y = rng.choice([0.0, 1.0, 0.0, 1.0, 2.0, 0.6, -0.7], size=lshape)
        return [a, b, y]

    def reference(xs, ps):
        d = (xs[0] - xs[1]).reshape(n, c)
        dist_sq = (d * d).sum(1)
        similar = _trunc(xs[2]).reshape(n) != 0
        if legacy:   # the CPU's gradient -alpha (a - b); the GPU kernel drops the (a - b)
            far = (margin - dist_sq).clamp_min(0)
        else:
            # contrastive_loss_layer.cpp's backward divides by dist + 1e-4, not dist: a dist
            # whose value is sqrt(dist_sq) and whose gradient is (a - b) / (dist + 1e-4)
            dist = dist_sq.detach().sqrt()
            dist = dist + (dist_sq - dist_sq.detach()) / (2 * (dist + 1e-4))
            far = (margin - dist).clamp_min(0) ** 2
        return [torch.where(similar, dist_sq, far).sum() / n / 2]

    return Case(name, _fmt(legacy=legacy, margin=margin, x=shape, y=lshape, lw=lw),
                f'type: "ContrastiveLoss"{text}{lw_field}', inputs, reference, grad=(0, 1),
                loss_weights={0: lw})


# ------------------------------------------------------------------------ Infogain loss
def infogain_case(rng, name):
    ndim = int(rng.integers(2, 5))
    shape = _shape(rng, 1, 4, ndim)
    axis, spelled = _axis(rng, ndim)
    if axis == 0 and math.prod(shape[1:]) % shape[0]:
        axis = spelled = 1     # LossLayer::Reshape: the label's first axis is the data's
    k = shape[axis]
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    lshape = (shape[0], outer * inner // shape[0])
    from_file = bool(rng.random() < 0.4)
    # H as the float32 that a BlobProto holds (file) or any float64 (bottom)
    h = np.float32(rng.uniform(0, 2, (k, k)) * (rng.random((k, k)) < 0.8)).astype(float) \
        if from_file else rng.uniform(-0.5, 2, (k, k))
    ignore = rng.choice([None, -1, int(rng.integers(0, k))])
    mode = str(rng.choice(["VALID", "FULL", "BATCH_SIZE", "NONE", "unset"]))
    spread = float(rng.choice([1.0, 1.0, 1.0, 40.0]))     # 40: probabilities below 1e-20
    lw, lw_field = _loss_weight(rng)
    two = bool(rng.random() < 0.25)
    frac = bool(rng.random() < 0.25)                  # labels cast with static_cast<int>
    loss_fields = "" if mode == "unset" else f"normalization: {mode}"
    if ignore is not None:
        loss_fields += f" ignore_label: {ignore}"
    info = ([f'source: "@H_FILE@"'] if from_file else []) + (
        [] if spelled == 1 else [f"axis: {spelled}"])
    fields = f" infogain_loss_param {{ {' '.join(info)} }}" if info else ""
    if loss_fields:
        fields += f" loss_param {{ {loss_fields} }}"
    if lw != 1.0 or two:
        fields += f" loss_weight: {lw:g}" + (" loss_weight: 0" if two else "")
    if from_file:
        H_FILES[name] = h

    def inputs(rng):
        labels = rng.integers(0, k, size=lshape) + rng.uniform(0, 0.99, lshape) * frac
        if ignore == -1:
            labels[rng.random(lshape) < 0.3] = rng.choice([-1.0, -1.5])
        xs = [rng.standard_normal(shape) * spread, labels]
        return xs if from_file else xs + [h]

    def reference(xs, ps):
        logp = F.log_softmax(xs[0], dim=axis)
        # infogain_loss_layer.cpp: -sum_l H[label, l] log(max(p_l, kLOG_THRESHOLD)), whose
        # backward is p_k sum_l H[label, l] - H[label, k] whether or not p_l was clipped
        clipped = logp.detach().exp().clamp_min(LOG_THRESHOLD).log()
        logp_c = logp + (clipped - logp).detach()
        logp_c = logp_c.movedim(axis, -1).reshape(outer * inner, k)
        hm = torch.from_numpy(h)
        label = _trunc(xs[1]).reshape(-1)
        valid = label != ignore if ignore is not None else torch.ones_like(label, dtype=bool)
        rows = hm[label.clamp(0, k - 1)]                 # (M, K): H[label, :]
        per = -(rows * logp_c).sum(1) * valid
        norm = fuzz._normalizer("VALID" if mode == "unset" else mode, outer, inner,
                                int(valid.sum()))
        return [per.sum() / norm, F.softmax(xs[0], dim=axis)][:2 if two else 1]

    summary = _fmt(axis=spelled, H="file" if from_file else "bottom", ignore=ignore, norm=mode,
                   frac=frac, lw=lw, tops=2 if two else 1, spread=spread, x=shape)
    return Case(name, summary, f'type: "InfogainLoss"{fields}', inputs, reference,
                n_top=2 if two else 1, loss_weights={0: lw}, unread_tops=(1,) if two else ())


# ------------------------------------------------------------ MultinomialLogisticLoss
def mlogistic_case(rng, name):
    n = int(rng.integers(1, 5))
    shape = (n,) + _shape(rng, 1, 4, int(rng.integers(1, 4)))
    dim = math.prod(shape[1:])
    lshape = (n,) if rng.random() < 0.6 else (n, 1)
    lw, lw_field = _loss_weight(rng)
    frac = bool(rng.random() < 0.3)                   # labels cast with static_cast<int>

    def inputs(rng):
        p = rng.uniform(0.05, 1, shape)
        pick = rng.random(shape)
        p[pick < 0.2] = 0.0                            # clipped to kLOG_THRESHOLD
        p[pick > 0.9] = 1e-25
        return [p, rng.integers(0, dim, size=lshape) + (rng.uniform(0, 0.99, lshape) * frac)]

    def reference(xs, ps):
        pl = xs[0].reshape(n, dim)[torch.arange(n), _trunc(xs[1]).reshape(n)]
        # multinomial_logistic_loss_layer.cpp: -log(max(p, kLOG_THRESHOLD)) / N, its
        # gradient -1 / (N max(p, kLOG_THRESHOLD)) also where p was clipped
        pc = pl + (pl.detach().clamp_min(LOG_THRESHOLD) - pl.detach())
        return [-pc.log().sum() / n]

    return Case(name, _fmt(x=shape, label=lshape, frac=frac, lw=lw),
                f'type: "MultinomialLogisticLoss"{lw_field}', inputs, reference,
                loss_weights={0: lw})


# ------------------------------------------------------------------------ BatchReindex
def reindex_case(rng, name):
    shape = (int(rng.integers(1, 5)),) + _shape(rng, 1, 4, int(rng.integers(0, 3)))
    m = int(rng.integers(1, 7))
    frac = bool(rng.random() < 0.3)

    def inputs(rng):
        idx = rng.integers(0, shape[0], size=m).astype(float)   # repeats sum in backward
        if frac:                                       # cast with static_cast<int>
            idx += rng.uniform(0, 0.99, m)
        return [rng.standard_normal(shape), idx]

    return Case(name, _fmt(x=shape, m=m, frac=frac), 'type: "BatchReindex"', inputs,
                lambda xs, ps: [xs[0][_trunc(xs[1])]])


# ------------------------------------------------------------------ Dropout, Split
def dropout_test_case(rng, name):
    shape = _shape(rng, 1, 4, int(rng.integers(1, 5)))
    ratio = float(rng.choice([0.5, _real(rng, 0.05, 0.95)]))
    in_place = bool(rng.random() < 0.4)
    fields = "" if ratio == 0.5 else f"dropout_param {{ dropout_ratio: {ratio:g} }}"
    return Case(name, _fmt(ratio=ratio, inplace=in_place, x=shape), f'type: "Dropout" {fields}',
                _normal(shape), lambda xs, ps: [xs[0] * 1.0], phase=TEST, in_place=in_place)


def split_case(rng, name):
    shape = _shape(rng, 1, 4, int(rng.integers(1, 5)))
    n = int(rng.integers(1, 5))
    return Case(name, _fmt(tops=n, x=shape), 'type: "Split"', _normal(shape),
                lambda xs, ps: [xs[0]] * n, n_top=n)


# ------------------------------------------------------------------- LSTMUnit, LSTM, RNN
def _cont(rng, shape, binary=True):
    """Sequence indicators: 0 starts a sequence (often at t = 0), else 1."""
    if not binary:
        return rng.uniform(-0.5, 1.5, shape)
    cont = (rng.random(shape) < 0.75).astype(float)
    if rng.random() < 0.6:
        cont[0] = 0
    return cont


def lstm_unit_case(rng, name):
    n, h = int(rng.integers(1, 4)), int(rng.integers(1, 4))

    def inputs(rng):
        return [rng.standard_normal((1, n, h)), rng.standard_normal((1, n, 4 * h)) * 2,
                _cont(rng, (1, n))]

    def reference(xs, ps):
        # lstm_unit_layer.cpp: gates i, f, o, g; f scaled by cont_t.  Caffe's CPU backward
        # writes f * (1 - f) with f already scaled, the GPU kernel cont * sigmoid'(x_f): the
        # same for cont in {0, 1}, the only values drawn here
        c_prev, x, cont = xs
        i, f, o = (torch.sigmoid(x[..., j * h:(j + 1) * h]) for j in range(3))
        g = torch.tanh(x[..., 3 * h:])
        c = cont[..., None] * f * c_prev + i * g
        return [c, o * torch.tanh(c)]

    return Case(name, _fmt(n=n, h=h), 'type: "LSTMUnit"', inputs, reference, grad=(0, 1),
                n_top=2)


def recurrent_forward(kind, x, cont, static, states, ps):
    """Caffe's unrolled LSTM or RNN (lstm_layer.cpp, rnn_layer.cpp) by hand: x (T, N, D),
    cont (T, N), static (N, D_static) or None, states [(N, H)] h_0 (and c_0); params in Caffe's
    order.  Returns the top (T, N, H) and the final states."""
    t_steps, n = cont.shape
    xw = x @ ps[0].t() + ps[1]                     # x_transform: W_x* x + b, all steps
    s = static @ ps[2].t() if static is not None else 0.0
    outs = []
    if kind == "LSTM":                             # params W_xc, b_c, [W_xc_static], W_hc
        w_hc = ps[-1]
        h = w_hc.shape[1]
        hh, cc = states
        for t in range(t_steps):
            ct = cont[t][:, None]
            a = (ct * hh) @ w_hc.t() + xw[t] + s   # Scale by cont_t, then the Eltwise sum
            i, f, o = (torch.sigmoid(a[:, j * h:(j + 1) * h]) for j in range(3))
            g = torch.tanh(a[:, 3 * h:])           # gates i, f, o, g
            cc = ct * f * cc + i * g               # LSTMUnit: f scaled by cont_t
            hh = o * torch.tanh(cc)
            outs.append(hh)
        return torch.stack(outs), [hh, cc]
    w_hh, w_ho, b_o = ps[-3:]                      # params W_xh, b_h, [W_xh_static], W_hh,
    (hh,) = states                                 # W_ho, b_o
    for t in range(t_steps):
        hh = torch.tanh((cont[t][:, None] * hh) @ w_hh.t() + xw[t] + s)
        outs.append(torch.tanh(hh @ w_ho.t() + b_o))
    return torch.stack(outs), [hh]


def recurrent_case(rng, name, kind):
    t_steps, n, h = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
    xdims = _shape(rng, 1, 4, int(rng.integers(1, 3)))
    static = bool(rng.random() < 0.35)
    sdims = _shape(rng, 1, 4, int(rng.integers(1, 3)))
    expose = bool(rng.random() < 0.4)
    # the RNN scales h_{t-1} by cont_t through a Scale layer only: any value is Caffe's
    binary = kind == "LSTM" or rng.random() < 0.7
    n_state = 2 if kind == "LSTM" else 1
    fields = (f"num_output: {h} weight_filler {{ type: \"gaussian\" std: 0.7 }} "
              "bias_filler { type: \"gaussian\" std: 0.5 }")
    if expose:
        fields += " expose_hidden: true"
    first = 3 if static else 2                     # the first exposed state's bottom

    def inputs(rng):
        xs = [rng.standard_normal((t_steps, n) + xdims), _cont(rng, (t_steps, n), binary)]
        if static:
            xs.append(rng.standard_normal((n,) + sdims))
        if expose:
            xs += [rng.standard_normal((1, n, h)) for _ in range(n_state)]
        return xs

    def reference(xs, ps):
        # Caffe shares only the data of the exposed initial states with the unrolled net:
        # no gradient reaches them (their diff is left at 0: detached here)
        states = ([v[0].detach() for v in xs[first:first + n_state]] if expose
                  else [torch.zeros(n, h, dtype=torch.float64)] * n_state)
        y, finals = recurrent_forward(kind, xs[0].reshape(t_steps, n, -1), xs[1],
                                      xs[2].reshape(n, -1) if static else None, states, ps)
        return [y] + [v[None] for v in finals] if expose else [y]

    grad = ((0, 2) if static else (0,)) + (tuple(range(first, first + n_state)) if expose
                                           else ())
    summary = _fmt(T=t_steps, n=n, h=h, x=xdims, static=sdims if static else "-",
                   expose=expose, cont="01" if binary else "real")
    return Case(name, summary, f'type: "{kind}" recurrent_param {{ {fields} }}', inputs,
                reference, grad=grad, n_top=1 + (n_state if expose else 0),
                # Caffe shares only the data of the final-state tops: their diffs go unread
                unread_tops=tuple(range(1, 1 + n_state)) if expose else ())


# ------------------------------------------------------------------------- the cases
def _draw(tag, n, make, *args):
    rng = np.random.default_rng([fuzz.SEED, zlib.crc32(tag.encode())])
    return [make(rng, f"{tag}-{i:02d}", *args) for i in range(n)]


CASES = (_draw("embed", 25, embed_case) + _draw("reduction", 30, reduction_case)
         + _draw("tile", 20, tile_case) + _draw("mvn", 30, mvn_case)
         + _draw("clip", 20, clip_case) + _draw("swish", 20, swish_case)
         + _draw("spp", 25, spp_case) + _draw("im2col", 30, im2col_case)
         + _draw("hinge", 20, hinge_case) + _draw("contrastive", 24, contrastive_case)
         + _draw("infogain", 30, infogain_case) + _draw("mlogistic", 20, mlogistic_case)
         + _draw("reindex", 20, reindex_case) + _draw("dropout", 10, dropout_test_case)
         + _draw("split", 10, split_case) + _draw("lstmunit", 20, lstm_unit_case)
         + _draw("lstm", 30, recurrent_case, "LSTM") + _draw("rnn", 30, recurrent_case, "RNN"))
FORWARD_CASES = (_draw("argmax", 30, argmax_case) + _draw("accuracy", 30, accuracy_case)
                 + _draw("threshold", 20, threshold_case))


def _with_files(case, tmp_path):
    """The case with its infogain matrix written where its layer reads it."""
    if case.name not in H_FILES:
        return case
    path = tmp_path / "H.binaryproto"
    write_blobproto(path, array_to_blobproto(H_FILES[case.name]))
    return dataclasses.replace(case, layer=case.layer.replace("@H_FILE@", str(path)))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_layer_matches_torch(case, tmp_path):
    fuzz.test_layer_matches_torch(_with_files(case, tmp_path))


def _net(case, xs, force_backward=False, phase=None):
    text, bottoms, tops = fuzz.net_text(case, xs)
    if not force_backward:
        text = text.replace("force_backward: true", "force_backward: false")
    net = Net(parse_text(text, caffe_pb2.NetParameter, filename=f"<{case.name}>"),
              case.phase if phase is None else phase, mode="CPU", dtype=np.float64)
    for b, x in zip(bottoms, xs):
        net.blobs[b].data[...] = x
    return net, text, bottoms, tops


@pytest.mark.parametrize("case", FORWARD_CASES, ids=[c.id for c in FORWARD_CASES])
def test_forward_matches_torch(case):
    """Layers without a backward in Caffe: forward only, in a net that asks no gradient."""
    rng = np.random.default_rng([fuzz.SEED, zlib.crc32(case.name.encode()), 1])
    xs = case.inputs(rng)
    net, text, _, tops = _net(case, xs)
    net.forward()
    want = case.reference([torch.tensor(x) for x in xs], [])
    assert len(want) == len(tops)
    for i, (t, w) in enumerate(zip(tops, want)):
        fuzz.assert_close(f"top {i}", net.blobs[t].data, w.numpy(), text)


# ------------------------------------------------------- gradients asked of no-backward layers
FIRST_FORWARD = {c.name.split("-")[0]: c for c in FORWARD_CASES if c.name.endswith("-00")}


@pytest.mark.parametrize("tag", ["argmax", "accuracy", "threshold"])
def test_a_gradient_asked_of_a_layer_without_backward(tag):
    """Caffe's ArgMax, Accuracy and Threshold backwards are NOT_IMPLEMENTED (Accuracy's only
    where propagate_down), and none overrides AllowForceBackward, so a Caffe net with
    force_backward aborts in their backward.  minicaffe: asked directly, each raises
    NotImplementedError; under force_backward, Threshold's backward raises as Caffe aborts,
    while ArgMax and Accuracy refuse to be forced (allow_force_backward is False) and the
    backward leaves their bottoms without a gradient."""
    case = FIRST_FORWARD[tag]
    rng = np.random.default_rng([fuzz.SEED, zlib.crc32(case.name.encode()), 1])
    xs = case.inputs(rng)
    net, _, bottoms, tops = _net(case, xs, force_backward=True)
    layer = net.layers[net.layer_index("fuzzed")]
    net.forward()
    bottom_blobs = [net.blobs[b] for b in bottoms]
    top_blobs = [net.blobs[t] for t in tops]
    with pytest.raises(NotImplementedError, match="fuzzed"):
        layer.backward(top_blobs, [True] + [False] * (len(bottoms) - 1), bottom_blobs)
    if tag == "threshold":
        with pytest.raises(NotImplementedError, match="Threshold"):
            net.backward()
        return
    assert not any(net.bottom_need_backward[net.layer_index("fuzzed")])
    for b in bottom_blobs:
        b.diff[...] = 7.0
    net.backward()
    for b in bottom_blobs:
        np.testing.assert_array_equal(b.diff, 7.0)


# ----------------------------------------------------------------------- SPP STOCHASTIC
@pytest.mark.parametrize("phase", [TRAIN, TEST])
def test_spp_stochastic_samples_a_pixel_of_each_window(phase):
    """SPP's levels are Pooling layers made from a fresh LayerParameter (spp_layer.cpp), so
    in phase TRAIN whatever the net's: STOCHASTIC samples a pixel of each window in a TEST
    net too (never the test-time average sum(x^2) / sum(x)), and backward sends each output's
    diff to the pixel it sampled (StoPoolBackward).  Caffe's pooling refuses padding for
    STOCHASTIC, so only sizes that every level divides evenly pool at all: (4, 8) here."""
    n, c, h, w, levels = 2, 2, 4, 8, 3
    case = Case("spp-stochastic", "",
                f'type: "SPP" spp_param {{ pyramid_height: {levels} pool: STOCHASTIC }}',
                None, None)
    rng = np.random.default_rng([fuzz.SEED, 5])
    x = rng.permutation(np.linspace(0.1, 1, n * c * h * w)).reshape(n, c, h, w)  # distinct
    net, text, bottoms, tops = _net(case, [x], force_backward=True, phase=phase)
    net.forward()
    y = np.array(net.blobs[tops[0]].data, copy=True)
    dy = rng.standard_normal(y.shape)
    want = np.zeros_like(x)
    offset = 0
    for level in range(levels):
        bins = 2 ** level
        kh, kw = h // bins, w // bins
        for (i, j, b, ch) in itertools.product(range(bins), range(bins), range(n), range(c)):
            k = offset + (ch * bins + i) * bins + j
            win = x[b, ch, i * kh:(i + 1) * kh, j * kw:(j + 1) * kw]
            hit = np.argwhere(win == y[b, k])
            assert len(hit) == 1, f"level {level} window {(i, j)}: {y[b, k]} is no pixel of it"
            want[b, ch, i * kh + hit[0][0], j * kw + hit[0][1]] += dy[b, k]
        offset += c * bins * bins
    for _ in range(2):
        net.blobs[tops[0]].diff[...] = dy
        net.backward()
        fuzz.assert_close("bottom diff", net.blobs[bottoms[0]].diff, want, text)


def test_spp_stochastic_refuses_a_padded_level():
    """A 5 x 5 input pools its 2 x 2 level with kernel 3 and pad 1 (GetPoolingParam), which
    Caffe's PoolingLayer refuses for STOCHASTIC ("Padding implemented only for average and
    max pooling")."""
    case = Case("spp-stochastic-pad", "",
                'type: "SPP" spp_param { pyramid_height: 2 pool: STOCHASTIC }', None, None)
    with pytest.raises(ValueError, match="pyramid level 1 .*padding implemented only for "
                       "average and max pooling"):
        _net(case, [np.ones((1, 1, 5, 5))])


# --------------------------------------------------------------------------------- Silence
@pytest.mark.parametrize("n", [1, 2, 3])
def test_silence_zeroes_the_diffs_of_its_bottoms(n):
    """silence_layer.cpp: no top; backward sets each bottom's diff to 0 (caffe_set), twice
    alike.  The diffs hold something else before, so that a no-op would fail."""
    case = Case(f"silence-{n}", f"n={n}", 'type: "Silence"', _normal(*[(2, n, 3)] * n),
                lambda xs, ps: [], grad=tuple(range(n)), n_top=0)
    rng = np.random.default_rng([fuzz.SEED, n])
    xs = case.inputs(rng)
    net, _, bottoms, _ = _net(case, xs, force_backward=True)
    net.forward()
    for _ in range(2):
        for b in bottoms:
            net.blobs[b].diff[...] = rng.standard_normal(net.blobs[b].shape)
        net.backward()
        for b, x in zip(bottoms, xs):
            np.testing.assert_array_equal(net.blobs[b].diff, np.zeros_like(x))
            np.testing.assert_array_equal(net.blobs[b].data, x)


# --------------------------------------------------------------------------- Dropout TRAIN
@pytest.fixture
def restore_seed():
    seed = mc_rng.current_seed()
    yield
    mc_rng.set_random_seed(seed)


def _dropout_net(ratio, shape, in_place, seed):
    mc_rng.set_random_seed(seed)
    fields = f"dropout_param {{ dropout_ratio: {ratio:g} }}"
    case = Case("dropout-train", "", f'type: "Dropout" {fields}', _normal(shape),
                lambda xs, ps: [], phase=TRAIN, in_place=in_place)
    x = np.random.default_rng([fuzz.SEED, 7]).standard_normal(shape)
    net, text, bottoms, tops = _net(case, [x], force_backward=True)
    return net, net.layers[net.layer_index("fuzzed")], x, bottoms[0], tops[0]


@pytest.mark.parametrize("ratio,in_place", [(0.5, False), (0.3, True), (0.8, False),
                                            (0.0, False)])
def test_dropout_train_applies_its_seeded_mask(ratio, in_place, restore_seed):
    """TRAIN: y = x * mask * scale, scale = 1 / (1 - ratio) (Caffe's, in the net's type), and
    mask[i] = rand[i] > static_cast<unsigned int>(UINT_MAX * ratio), Caffe's GPU rule (its CPU
    code draws a Bernoulli instead).  The draws are minicaffe's own counter-based stream, not
    Caffe's: rand is draw c of the layer's stream (minicaffe.rng.stream_uint32), c counting
    the layer's TRAIN forwards.  So: the mask follows the rule on that draw, keeps 1 - ratio
    within 5 binomial standard deviations, the next forward takes the next draw, the same
    seed gives the same key and so the same mask, and backward applies the forward's mask
    (twice alike)."""
    shape = (4, 5, 6, 7)
    net, layer, x, b, t = _dropout_net(ratio, shape, in_place, seed=1234)
    thres = int(np.float64(4294967295.0) * np.float64(np.float32(ratio)))   # double net
    scale = 1.0 / (1.0 - float(np.float32(ratio)))
    key = int(layer.rng_state[0])
    masks = []
    for c in range(2):
        net.blobs[b].data[...] = x
        net.forward()
        mask = np.array(layer.internal("mask").data, copy=True)
        rand = mc_rng.stream_uint32(key, c, 0, mask.size).reshape(shape)
        np.testing.assert_array_equal(mask, rand > thres)
        np.testing.assert_array_equal(net.blobs[t].data, (x * mask) * scale)
        masks.append(mask)
    keep = 1.0 - ratio
    assert abs(masks[0].mean() - keep) <= 5 * math.sqrt(keep * (1 - keep) / mask.size) + 1e-12
    assert ratio == 0 or not np.array_equal(masks[0], masks[1])
    dy = np.random.default_rng(3).standard_normal(shape)
    for _ in range(2):
        net.blobs[t].diff[...] = dy
        net.backward()
        np.testing.assert_array_equal(net.blobs[b].diff, (dy * masks[1]) * scale)
    again, layer2, _, _, _ = _dropout_net(ratio, shape, in_place, seed=1234)
    assert int(layer2.rng_state[0]) == key
    again.forward()
    np.testing.assert_array_equal(layer2.internal("mask").data, masks[0])


# ------------------------------------------------------------------- LSTM / RNN carried state
@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_recurrent_state_carries_to_the_next_forward(kind):
    """Without expose_hidden Caffe copies h_T (and c_T) of one forward into the initial
    state of the next (recurrent_layer.cpp); the first starts from 0.  Two forwards against
    the hand reference, the second with cont_0 = 1 so that the carried state counts."""
    t_steps, n, h, d = 3, 2, 2, 3
    rng = np.random.default_rng([fuzz.SEED, zlib.crc32(kind.encode())])
    layer_text = (f'type: "{kind}" recurrent_param {{ num_output: {h} weight_filler {{ type: '
                  '"gaussian" std: 0.7 } bias_filler { type: "gaussian" std: 0.5 } }')
    case = Case(f"carry-{kind}", "", layer_text, None, None)
    runs = [[rng.standard_normal((t_steps, n, d)), _cont(rng, (t_steps, n))] for _ in range(2)]
    runs[1][1][0] = 1
    net, text, bottoms, tops = _net(case, runs[0])
    layer = net.layers[net.layer_index("fuzzed")]
    ps = [torch.tensor(np.array(p.data)) for p in layer.blobs]
    states = [torch.zeros(n, h, dtype=torch.float64)] * (2 if kind == "LSTM" else 1)
    for i, xs in enumerate(runs):
        for b, x in zip(bottoms, xs):
            net.blobs[b].data[...] = x
        net.forward()
        want, states = recurrent_forward(kind, torch.tensor(xs[0]), torch.tensor(xs[1]), None,
                                         states, ps)
        fuzz.assert_close(f"forward {i}", net.blobs[tops[0]].data, want.numpy(), text)
