#!/usr/bin/env python3
"""A prototxt's own network in PyTorch: the peer for the speed comparisons.

torchvision's models are not the Caffe networks minicaffe trains.  Its AlexNet has
64/192/384/256/256 convolution channels, no groups and no LRN (Caffe's bvlc_alexnet:
96/256/384/384/256, groups of 2 in conv2, conv4 and conv5, two LRN layers); its GoogLeNet
has BatchNorm after every convolution and no LRN; its ResNets stride in the 3x3 convolution
(Caffe's KaimingHe models stride in the first 1x1).  A ratio of images per second between
two frameworks compares two training jobs only when both train the same network, so
:class:`TorchNet` builds a ``torch.nn.Module`` from a NetParameter, layer by layer, the way
a PyTorch user would write it:

* Convolution -> ``nn.Conv2d`` (groups, dilation, bias_term); 2-D only.
* Pooling -> ``nn.MaxPool2d`` / ``nn.AvgPool2d`` with ``ceil_mode`` from ``round_mode``
  (CEIL, Caffe's default, or FLOOR) and ``count_include_pad=True``: Caffe's output size
  (rounded, then one fewer where the last window would start in the padding) and its
  average divisor (the window clipped to the padded image) are PyTorch's in that mode.
  ``global_pooling`` takes the whole map.
* LRN (ACROSS_CHANNELS) -> ``nn.LocalResponseNorm`` (both divide alpha by the size).
* BatchNorm followed by a Scale on its top -> one ``nn.BatchNorm2d`` with the Scale as its
  affine part (``momentum = 1 - moving_average_fraction``); a BatchNorm alone has no affine.
  TRAIN normalizes with the batch's biased variance in both.  The running statistics are
  not Caffe's: Caffe keeps sums and a factor s <- maf s + 1 (so its first TRAIN pass stores
  the batch's own mean), PyTorch an exponential average started at 0 and 1; this changes
  what a TEST pass after training sees, not a TRAIN step's arithmetic.
* ReLU (in place where the prototxt computes it in place), Sigmoid, TanH, Dropout
  (``nn.Dropout``, inverted as Caffe's; the identity in a TEST net), InnerProduct
  (``nn.Linear`` on the blob flattened from ``axis``), Concat, Eltwise (SUM with
  coefficients, PROD, MAX with Caffe's tie rule), Flatten, Softmax, Split and Silence.
* Deconvolution -> ``nn.ConvTranspose2d``; PReLU -> ``nn.PReLU``; ELU, AbsVal, BNLL
  (softplus), Power, Exp, Log; Crop, Reshape, Slice; LRN WITHIN_CHANNEL as Caffe composes it
  (a zero-padded average of squares over the window).
* SoftmaxWithLoss -> ``F.cross_entropy`` (Caffe's normalizations, ``ignore_label``, each
  sample's loss capped at -log(FLT_MIN) as Caffe's) and EuclideanLoss, weighted by the
  layer's ``loss_weight``; Accuracy under ``no_grad``.

The data layers' tops are the inputs (their shapes from Input, DummyData or MemoryData).
Any other layer type raises ``NotImplementedError`` naming the layer: the peer is the same
network or none.  ``tests/scripts/test_torch_peer.py`` checks the losses, every top and every
parameter gradient against minicaffe's own Net in float64, layer type by layer type, and
``tests/scripts/test_torch_peer_parity.py`` does so on the project's networks and on model-zoo
deploy nets (TRAIN and TEST).

    python3 scripts/torch_peer.py alexnet:256            # the PyTorch peer's shapes and size
"""
from __future__ import annotations

import argparse
import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

DATA_TYPES = ("Input", "DummyData", "MemoryData", "Data", "ImageData", "HDF5Data")


def _pair(values, h, w, default, what, layer):
    """Caffe's kernel/stride/pad rule: ``*_h``/``*_w`` if set, else the repeated field's one
    value for both axes (two values: one per axis), else ``default``."""
    if h is not None or w is not None:
        return (h if h is not None else default, w if w is not None else default)
    values = list(values)
    if not values:
        return (default, default)
    if len(values) == 1:
        return (values[0], values[0])
    if len(values) == 2:
        return tuple(values)
    raise NotImplementedError(f"layer {layer!r}: {len(values)} {what} values; the PyTorch peer "
                              "builds 2-D convolutions only")


def _opt(msg, field):
    return getattr(msg, field) if msg.HasField(field) else None


def _geometry(cp, name):
    """(kernel, stride, pad, dilation) pairs of a ConvolutionParameter."""
    return (_pair(cp.kernel_size, _opt(cp, "kernel_h"), _opt(cp, "kernel_w"), None, "kernel",
                  name),
            _pair(cp.stride, _opt(cp, "stride_h"), _opt(cp, "stride_w"), 1, "stride", name),
            _pair(cp.pad, _opt(cp, "pad_h"), _opt(cp, "pad_w"), 0, "pad", name),
            _pair(cp.dilation, None, None, 1, "dilation", name))


class TorchNet:
    """``torch.nn.Module`` factory for one phase of a NetParameter (see the module docstring).

    ``TorchNet(net_param)`` returns a module whose ``forward(**inputs)`` gives
    ``(loss, blobs)``: the loss layers' weighted sum and every blob by name (in-place layers
    overwrite their blob's entry, as in Caffe).  ``module.input_shapes`` maps each data top to
    its shape, ``module.layer_params`` each layer with parameters to its tensors in Caffe's
    blob order (Convolution/InnerProduct: weight, bias; BatchNorm+Scale: the Scale's gamma and
    beta), for copying weights in from a minicaffe Net.
    """

    def __new__(cls, net_param, phase=None):
        import torch
        from minicaffe.net import filter_net
        from minicaffe.proto import caffe_pb2, upgrade_net

        phase = caffe_pb2.TRAIN if phase is None else phase
        param = filter_net(upgrade_net(net_param), caffe_pb2.NetState(phase=phase))
        # built on the meta device, so that each layer's tops get their shapes from the layer
        # itself without computing anything, then given memory on the CPU and initialised
        with torch.device("meta"):
            peer, inits = _Builder(param, phase == caffe_pb2.TRAIN).build()
        peer.to_empty(device="cpu")
        for init in inits:
            init()
        return peer


# ------------------------------------------------------------- the layer types
_BUILDERS: dict = {}


def _builds(*types):
    """Register a builder ``f(b, lp) -> (module or None, fn or None[, tops])`` for layer
    types: ``fn(list of bottom tensors) -> list of top tensors`` (default: the module on the
    first bottom); ``tops`` where the layer writes other tops than its own."""
    def register(f):
        for t in types:
            _BUILDERS[t] = f
        return f
    return register


class _Builder:
    """One pass over the filtered layers: modules, step functions, blob shapes (meta)."""

    def __init__(self, param, train: bool):
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        from minicaffe.proto import caffe_pb2
        self.torch, self.nn, self.F, self.P = torch, nn, F, caffe_pb2
        self.layers = list(param.layer)
        self.train = train
        self.modules = nn.ModuleDict()
        self.key: dict = {}              # layer name -> ModuleDict key ('/' and '.' refused)
        self.steps: list = []            # (name, fn, bottoms, tops)
        self.shapes: dict = {}           # blob -> torch.Size
        self.input_shapes: dict = {}
        self.layer_params: dict = {}     # layer name -> [(module, attribute)] in Caffe's order
        self.losses: list = []           # (blob, weight)
        self.classes: list = []          # each classifier loss's number of classes
        self.inits: list = []            # run once the parameters have memory
        self.eval_only: list = []        # BatchNorm modules on their running statistics
        self.fused: set = set()          # Scale layers folded into the BatchNorm before them
        self.index = 0                   # the layer being built

    def shape(self, blob):
        return self.shapes[blob]

    def params(self, name, mod, *attrs):
        self.layer_params[name] = [(mod, a) for a in attrs]

    def loss(self, lp, classes=None):
        w = lp.loss_weight[0] if len(lp.loss_weight) else 1.0
        if w:
            self.losses.append((lp.top[0], w))
        if classes is not None:
            self.classes.append(classes)

    def build(self):
        torch = self.torch
        for self.index, lp in enumerate(self.layers):
            name, t = lp.name, lp.type
            bottoms, tops = list(lp.bottom), list(lp.top)
            for b in bottoms:
                if b not in self.shapes:
                    raise ValueError(f"layer {name!r} ({t}): bottom {b!r} is no earlier layer's "
                                     "top")
            if t in DATA_TYPES:
                _inputs(self, lp)
                continue
            if name in self.fused:
                continue
            if t not in _BUILDERS:
                raise NotImplementedError(f"layer {name!r}: type {t} has no PyTorch peer here "
                                          "(scripts/torch_peer.py)")
            mod, fn, *rest = _BUILDERS[t](self, lp)
            tops = rest[0] if rest else tops
            if mod is not None:
                self.modules[self.key.setdefault(name, f"m{len(self.key)}")] = mod
                if hasattr(mod, "reset_parameters"):
                    self.inits.append(mod.reset_parameters)
                if fn is None:
                    def fn(xs, m=mod):
                        return [m(xs[0])]
            if fn is None:                               # Silence
                continue
            with torch.no_grad():                        # the tops' shapes, on meta tensors
                outs = fn([torch.empty(self.shapes[b], device="meta") for b in bottoms])
            for top, o in zip(tops, outs):
                self.shapes[top] = o.shape
            self.steps.append((name, fn, bottoms, tops))
        return self.module(), self.inits

    def module(self):
        nn = self.nn
        steps, losses, refs, eval_only = self.steps, self.losses, self.layer_params, self.eval_only

        class Peer(nn.Module):
            def forward(self, **inputs):
                blobs = dict(inputs)
                for _, fn, bots, tps in steps:
                    for top, y in zip(tps, fn([blobs[b] for b in bots])):
                        blobs[top] = y
                loss = None
                for blob, w in losses:
                    term = blobs[blob] * w if w != 1.0 else blobs[blob]
                    loss = term if loss is None else loss + term
                return loss, blobs

            @property
            def layer_params(self) -> dict:
                """Each layer with parameters -> its tensors in Caffe's blob order (looked up
                now: ``to_empty`` and device moves replace the Parameter objects)."""
                return {n: [getattr(m, a) for m, a in r] for n, r in refs.items()}

            def train(self, mode: bool = True):
                super().train(mode)
                for m in eval_only:     # BatchNorm with use_global_stats: true
                    m.eval()
                return self

        peer = Peer()
        peer.layers = self.modules
        peer.input_shapes = self.input_shapes
        peer.classes = min(self.classes) if self.classes else None   # labels below fit all
        peer.blob_shapes = {k: tuple(v) for k, v in self.shapes.items()}
        peer.layer_modules = {n: self.modules[k] for n, k in self.key.items()}
        # as built, not only after a train() or eval() call: a module starts in training
        # mode, where nn.BatchNorm2d would normalize a TEST net (or use_global_stats: true)
        # with the batch's statistics instead of the stored ones
        peer.train()
        return peer


def _inputs(b, lp):
    """A data layer's tops are the peer's inputs, shaped as its parameters say."""
    t = lp.type
    if t == "Input":
        dims = [list(s.dim) for s in lp.input_param.shape]
    elif t == "DummyData":
        dp = lp.dummy_data_param
        dims = ([list(s.dim) for s in dp.shape] if len(dp.shape) else
                [[dp.num[j], dp.channels[j], dp.height[j], dp.width[j]]
                 for j in range(len(dp.num))])
    elif t == "MemoryData":
        mp = lp.memory_data_param
        dims = [[mp.batch_size, mp.channels, mp.height, mp.width], [mp.batch_size]]
    else:
        raise NotImplementedError(f"layer {lp.name!r}: the PyTorch peer takes its inputs from "
                                  f"Input, DummyData or MemoryData, not {t}")
    if len(dims) == 1 and len(lp.top) > 1:
        dims = dims * len(lp.top)
    for top, d in zip(lp.top, dims):
        b.shapes[top] = b.torch.Size(d)
        b.input_shapes[top] = tuple(d)


@_builds("Convolution", "Deconvolution")
def _convolution(b, lp):
    cp, name = lp.convolution_param, lp.name
    x = b.shape(lp.bottom[0])
    if cp.axis != 1 or len(x) != 4:
        raise NotImplementedError(f"layer {name!r}: the PyTorch peer builds 2-D convolutions on "
                                  f"axis 1 only (bottom {lp.bottom[0]!r} is {tuple(x)})")
    k, s, p, d = _geometry(cp, name)
    if lp.type == "Convolution":
        mod = b.nn.Conv2d(x[1], cp.num_output, k, s, p, d, groups=cp.group, bias=cp.bias_term)
    else:
        # Caffe's output size stride (in - 1) + dilation (k - 1) + 1 - 2 pad is PyTorch's
        # with output_padding 0; the weight is (C_in, C_out / group, kh, kw) in both
        mod = b.nn.ConvTranspose2d(x[1], cp.num_output, k, s, p, groups=cp.group,
                                   bias=cp.bias_term, dilation=d)
    b.params(name, mod, "weight", *(("bias",) if cp.bias_term else ()))
    return mod, None


@_builds("Pooling")
def _pooling(b, lp):
    pp, name, P = lp.pooling_param, lp.name, b.P.PoolingParameter
    if pp.pool not in (P.MAX, P.AVE):
        raise NotImplementedError(f"layer {name!r}: pooling method {P.PoolMethod.Name(pp.pool)}")
    if pp.global_pooling:
        k, s, pad = tuple(b.shape(lp.bottom[0])[2:]), (1, 1), (0, 0)
    else:
        def one(field):
            return [getattr(pp, field)] if pp.HasField(field) else []
        k = _pair(one("kernel_size"), _opt(pp, "kernel_h"), _opt(pp, "kernel_w"), None,
                  "kernel", name)
        s = _pair(one("stride"), _opt(pp, "stride_h"), _opt(pp, "stride_w"), 1, "stride", name)
        pad = _pair(one("pad"), _opt(pp, "pad_h"), _opt(pp, "pad_w"), 0, "pad", name)
    # Caffe's PoolingLayer::Reshape: ceil((in + 2 pad - k) / stride) + 1 for round_mode CEIL
    # (the default), floor for FLOOR; then, if pad > 0, one fewer where the last window would
    # start in the padding.  PyTorch's ceil_mode does the same, but drops that window without
    # padding too: where Caffe keeps a last window wholly past the input (ceil, no pad,
    # kernel < stride), filled with -FLT_MAX (MAX) or 0 / 0 (AVE), the peer refuses
    ceil = pp.round_mode == P.CEIL
    for i, size in enumerate(b.shape(lp.bottom[0])[2:]):
        last = -(-(size - k[i]) // s[i]) * s[i]          # Caffe's last window's start (ceil)
        if ceil and pad[i] == 0 and last >= size:
            raise NotImplementedError(
                f"layer {name!r}: Caffe's ceil-rounded pooling of {size} by kernel {k[i]}, "
                f"stride {s[i]} and no pad has a last window wholly outside the input "
                "(Caffe fills it with -FLT_MAX or 0 / 0); the PyTorch peer has no such window")
    if pp.pool == P.MAX:
        return b.nn.MaxPool2d(k, s, pad, ceil_mode=ceil), None
    return b.nn.AvgPool2d(k, s, pad, ceil_mode=ceil, count_include_pad=True), None


@_builds("LRN")
def _lrn(b, lp):
    lrn = lp.lrn_param
    if lrn.norm_region == b.P.LRNParameter.ACROSS_CHANNELS:
        return b.nn.LocalResponseNorm(lrn.local_size, lrn.alpha, lrn.beta, lrn.k), None
    F = b.F

    # Caffe: x (1 + alpha * mean of x^2 over the size x size window)^-beta, the window
    # zero-padded by (size - 1) / 2 and always divided by size^2
    def fn(xs, n=lrn.local_size, a=lrn.alpha, beta=lrn.beta):
        x = xs[0]
        mean = F.avg_pool2d(x * x, n, 1, (n - 1) // 2, count_include_pad=True)
        return [x * (1.0 + a * mean) ** (-beta)]
    return None, fn


@_builds("BatchNorm")
def _batch_norm(b, lp):
    bp = lp.batch_norm_param
    nxt = b.layers[b.index + 1] if b.index + 1 < len(b.layers) else None
    scale = (nxt is not None and nxt.type == "Scale" and list(nxt.bottom) == list(lp.top)
             and len(nxt.bottom) == 1)
    if scale and list(nxt.top) != list(nxt.bottom):
        # fused, the BatchNorm's own top is never written: fuse only where no other layer
        # reads it (else the Scale stays a layer of its own)
        later = b.layers[b.index + 2:]
        scale = not any(lp.top[0] in list(other.bottom) for other in later)
    global_stats = bp.use_global_stats if bp.HasField("use_global_stats") else not b.train
    mod = b.nn.BatchNorm2d(b.shape(lp.bottom[0])[1], eps=bp.eps,
                           momentum=1.0 - bp.moving_average_fraction, affine=scale)
    if global_stats:
        b.eval_only.append(mod)
    if not scale:
        return mod, None
    b.fused.add(nxt.name)
    if nxt.scale_param.bias_term:
        b.params(nxt.name, mod, "weight", "bias")
    else:
        b.params(nxt.name, mod, "weight")
        mod.bias.requires_grad_(False)    # reset_parameters leaves it at zero
    return mod, None, list(nxt.top)


@_builds("Scale")
def _scale(b, lp):
    sp, torch, nn = lp.scale_param, b.torch, b.nn
    if len(lp.bottom) != 1 or sp.axis != 1 or sp.num_axes != 1:
        raise NotImplementedError(f"layer {lp.name!r}: the PyTorch peer's Scale is one bottom, "
                                  "per channel (axis 1, num_axes 1)")
    c = b.shape(lp.bottom[0])[1]
    mod = nn.Module()
    mod.weight = nn.Parameter(torch.ones(c))
    mod.bias = nn.Parameter(torch.zeros(c)) if sp.bias_term else None
    b.params(lp.name, mod, "weight", *(("bias",) if sp.bias_term else ()))
    b.inits.append(lambda m=mod: (m.weight.data.fill_(1.0),
                                  m.bias is not None and m.bias.data.zero_()))

    def fn(xs, m=mod):
        view = (1, -1) + (1,) * (xs[0].dim() - 2)
        y = xs[0] * m.weight.view(view)
        return [y + m.bias.view(view) if m.bias is not None else y]
    return mod, fn


@_builds("ReLU")
def _relu(b, lp):
    slope, inplace = lp.relu_param.negative_slope, list(lp.top) == list(lp.bottom)
    return (b.nn.LeakyReLU(slope, inplace=inplace) if slope
            else b.nn.ReLU(inplace=inplace)), None


@_builds("PReLU")
def _prelu(b, lp):
    c = 1 if lp.prelu_param.channel_shared else b.shape(lp.bottom[0])[1]
    mod = b.nn.PReLU(c)                   # 0.25 at first, Caffe's default filler
    b.params(lp.name, mod, "weight")
    return mod, None


@_builds("Sigmoid", "TanH", "ELU", "Dropout", "AbsVal", "BNLL", "Softmax", "Split", "Silence",
         "Flatten")
def _elementwise(b, lp):
    t, nn, F = lp.type, b.nn, b.F
    if t == "Sigmoid":
        return nn.Sigmoid(), None
    if t == "TanH":
        return nn.Tanh(), None
    if t == "ELU":
        return nn.ELU(lp.elu_param.alpha), None
    if t == "Dropout":
        if not b.train:
            # Caffe's DropoutLayer::Forward_cpu copies bottom to top unless the phase is
            # TRAIN: a TEST net's Dropout is the identity whatever the module's mode
            return None, lambda xs: [xs[0]]
        return nn.Dropout(lp.dropout_param.dropout_ratio), None   # inverted, as Caffe's
    if t == "Silence":
        return None, None
    fns = {"AbsVal": lambda xs: [xs[0].abs()],
           "BNLL": lambda xs: [F.softplus(xs[0])],                # log(1 + exp(x))
           "Softmax": lambda xs, a=lp.softmax_param.axis: [b.torch.softmax(xs[0], a)],
           "Split": lambda xs, n=len(lp.top): [xs[0]] * n,
           "Flatten": lambda xs, a=lp.flatten_param.axis, e=lp.flatten_param.end_axis:
               [xs[0].flatten(a, e)]}
    return None, fns[t]


@_builds("Power", "Exp", "Log")
def _power(b, lp):
    torch, t = b.torch, lp.type
    if t == "Power":
        pp = lp.power_param
        return None, lambda xs, p=pp.power, a=pp.scale, s=pp.shift: [(s + a * xs[0]) ** p]
    ep = lp.exp_param if t == "Exp" else lp.log_param
    if ep.base != -1 and not ep.base > 0:
        raise ValueError(f"layer {lp.name!r} of type {t}: base must be strictly positive, or -1 "
                         f"for e; got {ep.base}")
    ln_base = 1.0 if ep.base == -1 else math.log(ep.base)
    if t == "Exp":                        # base^(shift + scale x)
        return None, lambda xs, a=ep.scale, s=ep.shift: [torch.exp(ln_base * (s + a * xs[0]))]
    return None, lambda xs, a=ep.scale, s=ep.shift: [torch.log(s + a * xs[0]) / ln_base]


@_builds("InnerProduct")
def _inner_product(b, lp):
    ip, x = lp.inner_product_param, b.shape(lp.bottom[0])
    if ip.transpose:
        raise NotImplementedError(f"layer {lp.name!r}: InnerProduct with transpose: true")
    axis = ip.axis % len(x)
    fan_in = 1
    for d in x[axis:]:
        fan_in *= d
    mod = b.nn.Linear(fan_in, ip.num_output, bias=ip.bias_term)
    b.params(lp.name, mod, "weight", *(("bias",) if ip.bias_term else ()))
    return mod, lambda xs, m=mod: [m(xs[0].flatten(axis))]


@_builds("Concat", "Slice", "Crop", "Reshape")
def _shape(b, lp):
    torch, t, x = b.torch, lp.type, b.shape(lp.bottom[0])
    if t == "Concat":
        cp = lp.concat_param
        axis = cp.concat_dim if cp.HasField("concat_dim") else cp.axis
        return None, lambda xs: [torch.cat(xs, axis)]
    if t == "Slice":
        sp = lp.slice_param
        axis = (sp.slice_dim if sp.HasField("slice_dim") else sp.axis) % len(x)
        points = list(sp.slice_point)
        if not points:
            if x[axis] % len(lp.top):
                raise ValueError(f"layer {lp.name!r} of type Slice: {x[axis]} does not split "
                                 f"into {len(lp.top)} equal parts")
            points = [x[axis] // len(lp.top) * i for i in range(1, len(lp.top))]
        widths = [e - s for s, e in zip([0] + points, points + [x[axis]])]
        return None, lambda xs: list(torch.split(xs[0], widths, axis))
    if t == "Crop":
        cp = lp.crop_param
        start = cp.axis % len(x)
        offs = list(cp.offset) or [0]
        if len(offs) == 1:
            offs = offs * (len(x) - start)
        if len(offs) != len(x) - start:
            raise ValueError(f"layer {lp.name!r} of type Crop: {len(offs)} offsets for the "
                             f"{len(x) - start} axes from axis {start} on")
        ref = tuple(b.shape(lp.bottom[1]))
        idx = tuple([slice(None)] * start + [slice(o, o + ref[start + i])
                                             for i, o in enumerate(offs)])
        return None, lambda xs: [xs[0][idx]]
    rp = lp.reshape_param                 # Reshape: axes [axis, axis + num_axes) replaced
    old = list(x)
    begin = rp.axis if rp.axis >= 0 else len(old) + rp.axis + 1
    end = len(old) if rp.num_axes == -1 else begin + rp.num_axes
    new = (old[:begin] + [old[begin + i] if d == 0 else int(d) for i, d in enumerate(rp.shape.dim)]
           + old[end:])
    return None, lambda xs: [xs[0].reshape(new)]


@_builds("Eltwise")
def _eltwise(b, lp):
    ep, torch, E = lp.eltwise_param, b.torch, b.P.EltwiseParameter
    op, coeffs = ep.operation, list(ep.coeff) or None

    def fn(xs):
        if op == E.PROD:
            y = xs[0]
            for x in xs[1:]:
                y = y * x
            return [y]
        if op == E.MAX:
            # Caffe's EltwiseLayer::Forward_cpu keeps the winner's index (max_idx_) and
            # Backward_cpu sends all of dy there: bottom 1 wins a tie with bottom 0 (it tests
            # x0 > x1), a later bottom only when strictly greater.  torch.maximum would split a
            # tie's gradient in halves; torch.where routes it to one side as Caffe does.
            y = torch.where(xs[0] > xs[1], xs[0], xs[1])
            for x in xs[2:]:
                y = torch.where(x > y, x, y)
            return [y]
        c = coeffs or [1.0] * len(xs)
        y = xs[0] if c[0] == 1.0 else c[0] * xs[0]
        for ci, x in zip(c[1:], xs[1:]):
            y = y + (x if ci == 1.0 else ci * x)
        return [y]
    return None, fn


_NEG_LOG_FLT_MIN = -math.log(2.0 ** -126)     # FLT_MIN, the smallest normal float32


@_builds("SoftmaxWithLoss")
def _softmax_loss(b, lp):
    P, F = b.P.LossParameter, b.F
    lossp = lp.loss_param
    if lp.softmax_param.axis != 1:
        raise NotImplementedError(f"layer {lp.name!r}: softmax axis {lp.softmax_param.axis}")
    norm = lossp.normalization if lossp.HasField("normalization") else (
        P.VALID if lossp.normalize else P.BATCH_SIZE)
    ignore = lossp.ignore_label if lossp.HasField("ignore_label") else None

    def fn(xs):
        logits, label = xs[0], xs[1]
        label = label.reshape(logits.shape[:1] + logits.shape[2:]).long()
        nll = F.cross_entropy(logits, label, reduction="none",
                              ignore_index=-100 if ignore is None else ignore)
        # Caffe's SoftmaxWithLossLayer::Forward_cpu takes -log(max(p, FLT_MIN)) (in double
        # nets too), so a sample's loss is at most -log(FLT_MIN) = 87.34; its Backward_cpu is
        # p - 1 unclamped.  The clamped value, with the unclamped value's gradient:
        nll = nll + (nll.clamp(max=_NEG_LOG_FLT_MIN) - nll).detach()
        total = nll.sum()
        if norm == P.VALID:               # Caffe: the labels not ignored
            if ignore is not None:
                return [total / (label != ignore).sum().clamp(min=1)]
            count = label.numel()
        elif norm == P.FULL:
            count = label.numel()
        elif norm == P.BATCH_SIZE:
            count = label.shape[0]
        else:
            count = 1
        return [total / max(count, 1)]
    b.loss(lp, classes=b.shape(lp.bottom[0])[1])
    return None, fn


@_builds("EuclideanLoss")
def _euclidean_loss(b, lp):
    b.loss(lp)
    return None, lambda xs: [((xs[0] - xs[1]) ** 2).sum() / (2 * xs[0].shape[0])]


@_builds("Accuracy")
def _accuracy(b, lp):
    def fn(xs, k=lp.accuracy_param.top_k):
        with b.torch.no_grad():
            hit = xs[0].topk(k, 1).indices.eq(xs[1].reshape(-1, 1).long()).any(1)
            return [hit.to(xs[0].dtype).mean()]
    return None, fn


def copy_from_net(peer, net) -> None:
    """Copy a minicaffe Net's parameters into ``peer`` (Caffe's blob order per layer), and the
    BatchNorm running statistics (Caffe's mean and variance over its scale factor)."""
    import numpy as np
    import torch

    with torch.no_grad():
        for name, tensors in peer.layer_params.items():
            blobs = net.params[name]
            for t, b in zip(tensors, blobs):
                t.copy_(torch.from_numpy(np.asarray(b.data).reshape(t.shape).copy()))
        for name, m in peer.layer_modules.items():
            if isinstance(m, torch.nn.BatchNorm2d) and name in net.params:
                mean, var, factor = (np.asarray(b.data) for b in net.params[name][:3])
                f = 0.0 if factor.ravel()[0] == 0 else 1.0 / factor.ravel()[0]
                m.running_mean.copy_(torch.from_numpy(mean.reshape(-1) * f))
                m.running_var.copy_(torch.from_numpy(var.reshape(-1) * f))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec", help="NET:BATCH, a network of scripts/gen_prototxt.py")
    args = ap.parse_args(argv)
    from scripts.gen_prototxt import build
    name, _, k = args.spec.partition(":")
    peer = TorchNet(build(name, batch=int(k or 1), data="dummy"))
    n = sum(p.numel() for p in peer.parameters())
    print(f"{name}: {len(peer.layers)} modules, {n:,} parameters, inputs {peer.input_shapes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
