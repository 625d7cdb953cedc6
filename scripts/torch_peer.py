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
* Pooling -> ``nn.MaxPool2d`` / ``nn.AvgPool2d`` with ``ceil_mode=True`` and
  ``count_include_pad=True``: Caffe's output size (ceil, then one fewer where the last
  window would start in the padding) and its average divisor (the window clipped to the
  padded image) are PyTorch's in that mode.  ``global_pooling`` takes the whole map.
* LRN (ACROSS_CHANNELS) -> ``nn.LocalResponseNorm`` (both divide alpha by the size).
* BatchNorm followed by a Scale on its top -> one ``nn.BatchNorm2d`` with the Scale as its
  affine part (``momentum = 1 - moving_average_fraction``); a BatchNorm alone has no affine.
* ReLU (in place where the prototxt computes it in place), Sigmoid, TanH, Dropout
  (``nn.Dropout``, inverted as Caffe's), InnerProduct (``nn.Linear`` on the blob flattened
  from ``axis``), Concat, Eltwise (SUM with coefficients, PROD, MAX), Flatten, Softmax,
  Split and Silence.
* Deconvolution -> ``nn.ConvTranspose2d``; PReLU -> ``nn.PReLU``; ELU, AbsVal, BNLL
  (softplus), Power, Exp, Log; Crop, Reshape, Slice; LRN WITHIN_CHANNEL as Caffe composes it
  (a zero-padded average of squares over the window).
* SoftmaxWithLoss -> ``F.cross_entropy`` (Caffe's normalizations, ``ignore_label``) and
  EuclideanLoss, weighted by the layer's ``loss_weight``; Accuracy under ``no_grad``.

The data layers' tops are the inputs (their shapes from Input, DummyData or MemoryData).
Any other layer type raises ``NotImplementedError`` naming the layer: the peer is the same
network or none.  ``tests/scripts/test_torch_peer.py`` checks the losses, every top and every
parameter gradient against minicaffe's own Net in float64.

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
LOSS_TYPES = ("SoftmaxWithLoss", "EuclideanLoss")


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
        from minicaffe.proto import caffe_pb2
        from minicaffe.proto import upgrade_net

        phase = caffe_pb2.TRAIN if phase is None else phase
        param = filter_net(upgrade_net(net_param), caffe_pb2.NetState(phase=phase))
        # built on the meta device, so that each layer's tops get their shapes from the layer
        # itself without computing anything, then given memory on the CPU and initialised
        with torch.device("meta"):
            peer, inits = _build(torch, param, phase == caffe_pb2.TRAIN)
        peer.to_empty(device="cpu")
        for init in inits:
            init()
        return peer


def _build(torch, param, train: bool):
    import torch.nn as nn
    import torch.nn.functional as F
    from minicaffe.proto import caffe_pb2

    P = caffe_pb2
    modules = nn.ModuleDict()
    steps: list = []                 # (name, fn(list of bottoms) -> list of tops, bottoms, tops)
    shapes: dict = {}                # blob -> torch.Size
    input_shapes: dict = {}
    layer_params: dict = {}
    losses: list = []                # (blob, weight)
    layers = list(param.layer)
    fused_scale: set = set()
    inits: list = []                 # run once the parameters have memory
    eval_only: list = []             # BatchNorm modules on their running statistics
    classes: list = []               # each loss layer's number of classes
    key = {}

    def mod_key(name):
        k = key.setdefault(name, f"m{len(key)}")   # ModuleDict keys cannot hold '/' or '.'
        return k

    def meta(name):
        return torch.empty(shapes[name], device="meta")

    for i, lp in enumerate(layers):
        name, t = lp.name, lp.type
        bottoms, tops = list(lp.bottom), list(lp.top)
        for b in bottoms:
            if b not in shapes:
                raise ValueError(f"layer {name!r} ({t}): bottom {b!r} is no earlier layer's top")
        if t in DATA_TYPES:
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
                raise NotImplementedError(f"layer {name!r}: the PyTorch peer takes its inputs "
                                          f"from Input, DummyData or MemoryData, not {t}")
            if len(dims) == 1 and len(tops) > 1:
                dims = dims * len(tops)
            for top, d in zip(tops, dims):
                shapes[top] = torch.Size(d)
                input_shapes[top] = tuple(d)
            continue

        fn, mod = None, None
        if t == "Convolution":
            cp = lp.convolution_param
            if cp.axis != 1:
                raise NotImplementedError(f"layer {name!r}: convolution axis {cp.axis}")
            kh, kw = _pair(cp.kernel_size, _opt(cp, "kernel_h"), _opt(cp, "kernel_w"), None,
                           "kernel", name)
            sh, sw = _pair(cp.stride, _opt(cp, "stride_h"), _opt(cp, "stride_w"), 1, "stride",
                           name)
            ph, pw = _pair(cp.pad, _opt(cp, "pad_h"), _opt(cp, "pad_w"), 0, "pad", name)
            dh, dw = _pair(cp.dilation, None, None, 1, "dilation", name)
            if len(shapes[bottoms[0]]) != 4:
                raise NotImplementedError(f"layer {name!r}: the PyTorch peer builds 2-D "
                                          f"convolutions only (bottom {bottoms[0]!r} is "
                                          f"{tuple(shapes[bottoms[0]])})")
            mod = nn.Conv2d(shapes[bottoms[0]][1], cp.num_output, (kh, kw), (sh, sw), (ph, pw),
                            (dh, dw), groups=cp.group, bias=cp.bias_term)
            layer_params[name] = [(mod, "weight")] + ([(mod, "bias")] if cp.bias_term else [])
        elif t == "Deconvolution":
            cp = lp.convolution_param
            kh, kw = _pair(cp.kernel_size, _opt(cp, "kernel_h"), _opt(cp, "kernel_w"), None,
                           "kernel", name)
            sh, sw = _pair(cp.stride, _opt(cp, "stride_h"), _opt(cp, "stride_w"), 1, "stride",
                           name)
            ph, pw = _pair(cp.pad, _opt(cp, "pad_h"), _opt(cp, "pad_w"), 0, "pad", name)
            dh, dw = _pair(cp.dilation, None, None, 1, "dilation", name)
            if cp.axis != 1 or len(shapes[bottoms[0]]) != 4:
                raise NotImplementedError(f"layer {name!r}: the PyTorch peer builds 2-D "
                                          "deconvolutions on axis 1 only")
            # Caffe's output size stride (in - 1) + dilation (k - 1) + 1 - 2 pad is PyTorch's
            # with output_padding 0; the weight is (C_in, C_out / group, kh, kw) in both
            mod = nn.ConvTranspose2d(shapes[bottoms[0]][1], cp.num_output, (kh, kw), (sh, sw),
                                     (ph, pw), groups=cp.group, bias=cp.bias_term,
                                     dilation=(dh, dw))
            layer_params[name] = [(mod, "weight")] + ([(mod, "bias")] if cp.bias_term else [])
        elif t == "PReLU":
            pp = lp.prelu_param
            c = 1 if pp.channel_shared else shapes[bottoms[0]][1]
            mod = nn.PReLU(c)              # 0.25 at first, Caffe's default filler
            layer_params[name] = [(mod, "weight")]
        elif t == "ELU":
            mod = nn.ELU(lp.elu_param.alpha)
        elif t == "AbsVal":
            def fn(xs):
                return [xs[0].abs()]
        elif t == "BNLL":
            def fn(xs):                    # log(1 + exp(x)), as Caffe's stable form
                return [F.softplus(xs[0])]
        elif t == "Power":
            pw_ = lp.power_param

            def fn(xs, p=pw_.power, a=pw_.scale, b=pw_.shift):
                return [(b + a * xs[0]) ** p]
        elif t in ("Exp", "Log"):
            ep = lp.exp_param if t == "Exp" else lp.log_param
            if ep.base != -1 and not ep.base > 0:
                raise ValueError(f"layer {name!r} of type {t}: base must be strictly positive, "
                                 f"or -1 for e; got {ep.base}")
            ln_base = 1.0 if ep.base == -1 else math.log(ep.base)

            def fn(xs, t=t, a=ep.scale, b=ep.shift, ln_base=ln_base):
                if t == "Exp":             # base^(shift + scale x)
                    return [torch.exp(ln_base * (b + a * xs[0]))]
                return [torch.log(b + a * xs[0]) / ln_base]
        elif t == "Crop":
            cp = lp.crop_param
            n = len(shapes[bottoms[0]])
            start = cp.axis % n
            offs = list(cp.offset) or [0]
            if len(offs) == 1:
                offs = offs * (n - start)
            if len(offs) != n - start:
                raise ValueError(f"layer {name!r} of type Crop: {len(offs)} offsets for the "
                                 f"{n - start} axes from axis {start} on")
            ref = tuple(shapes[bottoms[1]])

            def fn(xs, start=start, offs=offs, ref=ref):
                idx = [slice(None)] * start + [slice(o, o + ref[start + i])
                                               for i, o in enumerate(offs)]
                return [xs[0][tuple(idx)]]
        elif t == "Reshape":
            rp = lp.reshape_param
            old = list(shapes[bottoms[0]])
            n = len(old)
            begin = rp.axis if rp.axis >= 0 else n + rp.axis + 1
            end = n if rp.num_axes == -1 else begin + rp.num_axes
            spec = [old[begin + i] if d == 0 else int(d) for i, d in enumerate(rp.shape.dim)]
            new = old[:begin] + spec + old[end:]

            def fn(xs, new=new):
                return [xs[0].reshape(new)]
        elif t == "Slice":
            sp = lp.slice_param
            axis = sp.slice_dim if sp.HasField("slice_dim") else sp.axis
            axis %= len(shapes[bottoms[0]])
            size = shapes[bottoms[0]][axis]
            points = list(sp.slice_point)
            if not points:
                if size % len(tops):
                    raise ValueError(f"layer {name!r} of type Slice: {size} does not split "
                                     f"into {len(tops)} equal parts")
                points = [size // len(tops) * i for i in range(1, len(tops))]
            widths = [b - a for a, b in zip([0] + points, points + [size])]

            def fn(xs, axis=axis, widths=widths):
                return list(torch.split(xs[0], widths, axis))
        elif t == "Pooling":

            pp = lp.pooling_param
            if pp.pool not in (P.PoolingParameter.MAX, P.PoolingParameter.AVE):
                raise NotImplementedError(f"layer {name!r}: pooling method "
                                          f"{P.PoolingParameter.PoolMethod.Name(pp.pool)}")
            if pp.global_pooling:
                k, s, pad = tuple(shapes[bottoms[0]][2:]), (1, 1), (0, 0)
            else:
                k = _pair([pp.kernel_size] if pp.HasField("kernel_size") else [],
                          _opt(pp, "kernel_h"), _opt(pp, "kernel_w"), None, "kernel", name)
                s = _pair([pp.stride] if pp.HasField("stride") else [], _opt(pp, "stride_h"),
                          _opt(pp, "stride_w"), 1, "stride", name)
                pad = _pair([pp.pad] if pp.HasField("pad") else [], _opt(pp, "pad_h"),
                            _opt(pp, "pad_w"), 0, "pad", name)
            mod = (nn.MaxPool2d(k, s, pad, ceil_mode=True) if pp.pool == P.PoolingParameter.MAX
                   else nn.AvgPool2d(k, s, pad, ceil_mode=True, count_include_pad=True))
        elif t == "LRN":
            lrn = lp.lrn_param
            mod = nn.LocalResponseNorm(lrn.local_size, lrn.alpha, lrn.beta, lrn.k)
            if lrn.norm_region == P.LRNParameter.WITHIN_CHANNEL:
                # Caffe: x (1 + alpha * mean of x^2 over the size x size window)^-beta, the
                # window zero-padded by (size - 1) / 2 and always divided by size^2
                mod = None

                def fn(xs, n=lrn.local_size, a=lrn.alpha, b=lrn.beta):
                    x = xs[0]
                    mean = F.avg_pool2d(x * x, n, 1, (n - 1) // 2, count_include_pad=True)
                    return [x * (1.0 + a * mean) ** (-b)]
        elif t == "BatchNorm":
            bp = lp.batch_norm_param
            nxt = layers[i + 1] if i + 1 < len(layers) else None
            scale = (nxt is not None and nxt.type == "Scale" and list(nxt.bottom) == tops
                     and len(nxt.bottom) == 1)
            global_stats = (bp.use_global_stats if bp.HasField("use_global_stats")
                            else not train)
            mod = nn.BatchNorm2d(shapes[bottoms[0]][1], eps=bp.eps,
                                 momentum=1.0 - bp.moving_average_fraction, affine=scale)
            if scale:
                fused_scale.add(nxt.name)
                if not nxt.scale_param.bias_term:
                    inits.append(lambda m=mod: m.bias.data.zero_())
                    mod.bias.requires_grad_(False)
                layer_params[nxt.name] = ([(mod, "weight"), (mod, "bias")]
                                          if nxt.scale_param.bias_term else [(mod, "weight")])
                tops = list(nxt.top)
            if global_stats:
                eval_only.append(mod)
        elif t == "Scale":
            if name in fused_scale:
                continue
            sp = lp.scale_param
            if len(bottoms) != 1 or sp.axis != 1 or sp.num_axes != 1:
                raise NotImplementedError(f"layer {name!r}: the PyTorch peer's Scale is one "
                                          "bottom, per channel (axis 1, num_axes 1)")
            c = shapes[bottoms[0]][1]
            mod = nn.Module()
            mod.weight = nn.Parameter(torch.ones(c))
            mod.bias = nn.Parameter(torch.zeros(c)) if sp.bias_term else None
            layer_params[name] = [(mod, "weight")] + ([(mod, "bias")] if sp.bias_term else [])
            inits.append(lambda m=mod: (m.weight.data.fill_(1.0),
                                        m.bias is not None and m.bias.data.zero_()))

            def fn(xs, m=mod):
                view = (1, -1) + (1,) * (xs[0].dim() - 2)
                y = xs[0] * m.weight.view(view)
                return [y + m.bias.view(view) if m.bias is not None else y]
        elif t == "ReLU":
            slope = lp.relu_param.negative_slope
            inplace = tops == bottoms
            mod = (nn.LeakyReLU(slope, inplace=inplace) if slope else nn.ReLU(inplace=inplace))
        elif t == "Sigmoid":
            mod = nn.Sigmoid()
        elif t == "TanH":
            mod = nn.Tanh()
        elif t == "Dropout":
            mod = nn.Dropout(lp.dropout_param.dropout_ratio)
        elif t == "InnerProduct":
            ip = lp.inner_product_param
            axis = ip.axis % len(shapes[bottoms[0]])
            fan_in = 1
            for d in shapes[bottoms[0]][axis:]:
                fan_in *= d
            if ip.transpose:
                raise NotImplementedError(f"layer {name!r}: InnerProduct with transpose: true")
            mod = nn.Linear(fan_in, ip.num_output, bias=ip.bias_term)
            layer_params[name] = [(mod, "weight")] + ([(mod, "bias")] if ip.bias_term else [])

            def fn(xs, m=mod, axis=axis):
                return [m(xs[0].flatten(axis))]
        elif t == "Concat":
            cp = lp.concat_param
            axis = cp.concat_dim if cp.HasField("concat_dim") else cp.axis

            def fn(xs, axis=axis):
                return [torch.cat(xs, axis)]
        elif t == "Eltwise":
            ep = lp.eltwise_param
            op = ep.operation
            coeffs = list(ep.coeff) or None

            def fn(xs, op=op, coeffs=coeffs):
                if op == P.EltwiseParameter.PROD:
                    y = xs[0]
                    for x in xs[1:]:
                        y = y * x
                elif op == P.EltwiseParameter.MAX:
                    y = xs[0]
                    for x in xs[1:]:
                        y = torch.maximum(y, x)
                elif coeffs is None:
                    y = xs[0]
                    for x in xs[1:]:
                        y = y + x
                else:
                    y = coeffs[0] * xs[0]
                    for c, x in zip(coeffs[1:], xs[1:]):
                        y = y + c * x
                return [y]
        elif t == "Flatten":
            fp = lp.flatten_param

            def fn(xs, a=fp.axis, e=fp.end_axis):
                return [xs[0].flatten(a, e)]
        elif t == "Softmax":
            def fn(xs, axis=lp.softmax_param.axis):
                return [torch.softmax(xs[0], axis)]
        elif t == "Split":
            def fn(xs, n=len(tops)):
                return [xs[0]] * n
        elif t == "Silence":
            steps.append((name, None, bottoms, []))
            continue
        elif t == "SoftmaxWithLoss":
            lossp = lp.loss_param
            if lp.softmax_param.axis != 1:
                raise NotImplementedError(f"layer {name!r}: softmax axis {lp.softmax_param.axis}")
            norm = lossp.normalization if lossp.HasField("normalization") else (
                P.LossParameter.VALID if lossp.normalize else P.LossParameter.BATCH_SIZE)
            ignore = lossp.ignore_label if lossp.HasField("ignore_label") else None

            def fn(xs, ignore=ignore, norm=norm):
                logits, label = xs[0], xs[1]
                label = label.reshape(logits.shape[:1] + logits.shape[2:]).long()
                total = F.cross_entropy(logits, label, reduction="sum",
                                        ignore_index=-100 if ignore is None else ignore)
                if norm == P.LossParameter.VALID:     # Caffe: the labels not ignored
                    count = label.numel() if ignore is None else (label != ignore).sum()
                elif norm == P.LossParameter.FULL:
                    count = label.numel()
                elif norm == P.LossParameter.BATCH_SIZE:
                    count = label.shape[0]
                else:
                    count = 1
                return [total / max(count, 1) if isinstance(count, int)
                        else total / count.clamp(min=1)]
            w = lp.loss_weight[0] if len(lp.loss_weight) else 1.0
            if w:
                losses.append((tops[0], w))
            classes.append(shapes[bottoms[0]][1])
        elif t == "EuclideanLoss":
            def fn(xs):                    # sum of squared differences / (2 N)
                return [((xs[0] - xs[1]) ** 2).sum() / (2 * xs[0].shape[0])]
            w = lp.loss_weight[0] if len(lp.loss_weight) else 1.0
            if w:
                losses.append((tops[0], w))
        elif t == "Accuracy":
            ap = lp.accuracy_param

            def fn(xs, k=ap.top_k):
                with torch.no_grad():
                    hit = xs[0].topk(k, 1).indices.eq(xs[1].reshape(-1, 1).long()).any(1)
                    return [hit.to(xs[0].dtype).mean()]
        else:
            raise NotImplementedError(f"layer {name!r}: type {t} has no PyTorch peer here "
                                      "(scripts/torch_peer.py)")
        if mod is not None:
            modules[mod_key(name)] = mod
            if hasattr(mod, "reset_parameters"):
                inits.append(lambda m=mod: m.reset_parameters())
            if fn is None:
                def fn(xs, m=mod):
                    return [m(xs[0])]
        # the tops' shapes, from the layer itself on meta tensors
        with torch.no_grad():
            outs = fn([meta(b) for b in bottoms]) if t not in LOSS_TYPES + ("Accuracy",) \
                else [torch.empty((), device="meta")]
        for top, o in zip(tops, outs):
            shapes[top] = o.shape
        steps.append((name, fn, bottoms, tops))

    class Peer(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = modules

        def forward(self, **inputs):
            blobs = dict(inputs)
            for name, fn, bots, tps in steps:
                if fn is None:
                    continue
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
            return {n: [getattr(m, a) for m, a in refs] for n, refs in layer_params.items()}

        def train(self, mode: bool = True):
            super().train(mode)
            for m in eval_only:     # BatchNorm with use_global_stats: true
                m.eval()
            return self

    peer = Peer()
    peer.input_shapes = input_shapes
    peer.classes = min(classes) if classes else None    # labels below this fit every loss
    peer.blob_shapes = {k: tuple(v) for k, v in shapes.items()}
    peer.layer_modules = {n: modules[k] for n, k in key.items()}
    return peer, inits


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
