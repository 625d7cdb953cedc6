"""Helpers of tests/test_caffe_zoo3.py: Caffe's shape rules, and the text of the public
prototxt files that are too large (or not licensed) to keep under tests/data/zoo3/.

``caffe_shapes`` computes every blob's and every param's shape of a NetParameter the way
BVLC Caffe's layers do in their LayerSetUp/Reshape (src/caffe/layers/*.cpp), without
minicaffe's layers, so that a net minicaffe builds can be checked against it.

The generators return each file's text character for character as it is stored in the
public repository named in their docstring; each one's length is the stored file's
(``total_chars``), which the tests assert, so a slip in a generator shows.
"""
import math

import numpy as np

from minicaffe.proto import caffe_pb2


# ------------------------------------------------------------------ Caffe's shape rules
def _canon(axis, ndim):
    """Blob::CanonicalAxisIndex."""
    return axis + ndim if axis < 0 else axis


def _count(shape, start=0, end=None):
    part = tuple(shape)[start:end]
    return int(np.prod(part, dtype=np.int64)) if part else 1


def _spatial(cp, name, n, default):
    """BaseConvolutionLayer::LayerSetUp: ``name`` (stride, pad, dilation) per spatial
    axis: the _h/_w pair (2-d only; dilation has none), one value for all, or one each."""
    if n == 2 and name != "dilation" and cp.HasField(f"{name}_h"):
        return [getattr(cp, f"{name}_h"), getattr(cp, f"{name}_w")]
    vals = list(getattr(cp, name))
    if not vals:
        return [default] * n
    return vals * n if len(vals) == 1 else vals


def _conv_geometry(cp, bottom):
    axis = _canon(cp.axis, len(bottom))
    n = len(bottom) - axis - 1
    if cp.HasField("kernel_h"):
        k = [cp.kernel_h, cp.kernel_w]
    else:
        k = list(cp.kernel_size) * (n if len(cp.kernel_size) == 1 else 1)
    return axis, k, _spatial(cp, "stride", n, 1), _spatial(cp, "pad", n, 0), \
        _spatial(cp, "dilation", n, 1)


def _conv(lp, bottom):
    """ConvolutionLayer::compute_output_shape: (i + 2p - (d(k-1)+1)) / s + 1 (floor);
    weight (num_output, C/group, k...), bias (num_output,)."""
    cp = lp.convolution_param
    axis, k, s, p, d = _conv_geometry(cp, bottom)
    out = [(i + 2 * pp - (dd * (kk - 1) + 1)) // ss + 1
           for i, kk, ss, pp, dd in zip(bottom[axis + 1:], k, s, p, d)]
    params = [(cp.num_output, bottom[axis] // cp.group, *k)]
    if cp.bias_term:
        params.append((cp.num_output,))
    return [tuple(bottom[:axis]) + (cp.num_output, *out)], params


def _deconv(lp, bottom):
    """DeconvolutionLayer::compute_output_shape: s(i-1) + d(k-1)+1 - 2p; weight
    (C_in, num_output/group, k...)."""
    cp = lp.convolution_param
    axis, k, s, p, d = _conv_geometry(cp, bottom)
    out = [ss * (i - 1) + (dd * (kk - 1) + 1) - 2 * pp
           for i, kk, ss, pp, dd in zip(bottom[axis + 1:], k, s, p, d)]
    params = [(bottom[axis], cp.num_output // cp.group, *k)]
    if cp.bias_term:
        params.append((cp.num_output,))
    return [tuple(bottom[:axis]) + (cp.num_output, *out)], params


def _pool(lp, bottom):
    """PoolingLayer::Reshape: ceil (round_mode CEIL, the default) or floor of
    (i + 2p - k) / s, plus 1, less one where the last window would start in the padding;
    Caffe checks that on both axes when either has a pad (``if (pad_h_ || pad_w_)``)."""
    pp = lp.pooling_param
    n, c, h, w = bottom
    if pp.global_pooling:
        (kh, kw), (ph, pw), (sh, sw) = (h, w), (0, 0), (1, 1)
    else:
        kh, kw = (pp.kernel_h, pp.kernel_w) if pp.HasField("kernel_h") else (pp.kernel_size,) * 2
        ph, pw = (pp.pad_h, pp.pad_w) if pp.HasField("pad_h") else (pp.pad,) * 2
        sh, sw = (pp.stride_h, pp.stride_w) if pp.HasField("stride_h") else (pp.stride,) * 2
    rnd = math.floor if pp.round_mode == caffe_pb2.PoolingParameter.FLOOR else math.ceil

    def one(i, k, s, p):
        o = int(rnd((i + 2 * p - k) / s)) + 1
        if (ph or pw) and (o - 1) * s >= i + p:
            o -= 1
        return o
    top = (n, c, one(h, kh, sh, ph), one(w, kw, sw, pw))
    return [top] * len(lp.top), []          # MAX's second top, the mask, has the same shape


def _inner_product(lp, bottom):
    """InnerProductLayer: K = count from axis on; top = shape[:axis] + (N,); weight (N, K),
    (K, N) when transposed."""
    ipp = lp.inner_product_param
    axis = _canon(ipp.axis, len(bottom))
    k = _count(bottom, axis)
    params = [(k, ipp.num_output) if ipp.transpose else (ipp.num_output, k)]
    if ipp.bias_term:
        params.append((ipp.num_output,))
    return [tuple(bottom[:axis]) + (ipp.num_output,)], params


def _axes(bottom, axis, num_axes):
    axis = _canon(axis, len(bottom))
    return tuple(bottom[axis:len(bottom) if num_axes == -1 else axis + num_axes])


def _scale(lp, bottoms):
    """ScaleLayer: one bottom: a learned scale of shape[axis:axis+num_axes] (and a bias of
    that shape with bias_term); two bottoms: the second is the scale, only the bias is
    learned."""
    sp = lp.scale_param
    if len(bottoms) > 1:
        return [bottoms[0]], ([tuple(bottoms[1])] if sp.bias_term else [])
    shape = _axes(bottoms[0], sp.axis, sp.num_axes)
    return [bottoms[0]], [shape] * (2 if sp.bias_term else 1)


def _bias(lp, bottoms):
    bp = lp.bias_param
    if len(bottoms) > 1:
        return [bottoms[0]], []
    return [bottoms[0]], [_axes(bottoms[0], bp.axis, bp.num_axes)]


def _batch_norm(lp, bottom):
    """BatchNormLayer: mean (C,), variance (C,), and the moving-average factor (1,)."""
    c = 1 if len(bottom) == 1 else bottom[1]
    return [bottom], [(c,), (c,), (1,)]


def _prelu(lp, bottom):
    """PReLULayer: one slope per channel, or a 0-axis blob when channel_shared."""
    c = bottom[1] if len(bottom) > 1 else 1
    return [bottom], [() if lp.prelu_param.channel_shared else (c,)]


def _concat(lp, bottoms):
    cp = lp.concat_param
    axis = _canon(cp.concat_dim if cp.HasField("concat_dim") else cp.axis, len(bottoms[0]))
    top = list(bottoms[0])
    top[axis] = sum(b[axis] for b in bottoms)
    return [tuple(top)], []


def _slice(lp, bottom):
    sp = lp.slice_param
    axis = _canon(sp.slice_dim if sp.HasField("slice_dim") else sp.axis, len(bottom))
    if len(sp.slice_point):
        edges = [0, *sp.slice_point, bottom[axis]]
        sizes = [b - a for a, b in zip(edges, edges[1:])]
    else:
        sizes = [bottom[axis] // len(lp.top)] * len(lp.top)
    return [tuple(bottom[:axis]) + (s,) + tuple(bottom[axis + 1:]) for s in sizes], []


def _flatten(lp, bottom):
    fp = lp.flatten_param
    a, e = _canon(fp.axis, len(bottom)), _canon(fp.end_axis, len(bottom))
    return [tuple(bottom[:a]) + (_count(bottom, a, e + 1),) + tuple(bottom[e + 1:])], []


def _reshape(lp, bottom):
    rp = lp.reshape_param
    start = rp.axis + len(bottom) + 1 if rp.axis < 0 else rp.axis
    end = len(bottom) if rp.num_axes == -1 else start + rp.num_axes
    top = list(bottom[:start])
    top += [bottom[start + i] if d == 0 else d for i, d in enumerate(rp.shape.dim)]
    top += list(bottom[end:])
    if -1 in top:
        top[top.index(-1)] = _count(bottom) // _count([t for t in top if t != -1])
    return [tuple(top)], []


def _crop(lp, bottoms):
    axis = _canon(lp.crop_param.axis, len(bottoms[0]))
    return [tuple(bottoms[0][:axis]) + tuple(bottoms[1][axis:])], []


def _embed(lp, bottom):
    """EmbedLayer: top = bottom's shape + (num_output,); weight (input_dim, num_output),
    bias (num_output,)."""
    ep = lp.embed_param
    params = [(ep.input_dim, ep.num_output)] + ([(ep.num_output,)] if ep.bias_term else [])
    return [tuple(bottom) + (ep.num_output,)], params


def _recurrent(lp, bottoms):
    """RecurrentLayer: top (T, N, num_output); the params are the unrolled net's, in its
    layer order (LSTMLayer/RNNLayer::FillUnrolledNet): LSTM W_xc (4H, D), b_c (4H,),
    [W_xc_static (4H, D_static)], W_hc (4H, H); RNN W_xh (H, D), b_h (H,), [W_xh_static
    (H, D_static)], W_hh (H, H), W_ho (H, H), b_o (H,).  D counts x's axes from 2 on,
    D_static x_static's from 1 on; exposed h_T (and c_T) are (1, N, H)."""
    rp = lp.recurrent_param
    h, lstm = rp.num_output, lp.type == "LSTM"
    g = 4 * h if lstm else h
    x = bottoms[0]
    params = [(g, _count(x, 2)), (g,)]
    exposed = (2 if lstm else 1) if rp.expose_hidden else 0   # h_0 (and c_0) bottoms
    if len(bottoms) > 2 + exposed:
        params.append((g, _count(bottoms[2], 1)))
    params.append((g, h))
    if lp.type == "RNN":
        params += [(h, h), (h,)]
    return [(x[0], x[1], h)] + [(1, x[1], h)] * (len(lp.top) - 1), params   # h_T, c_T


def _eltwise(lp, bottoms):
    assert all(b == bottoms[0] for b in bottoms), (lp.name, bottoms)
    return [bottoms[0]], []


def _shapes_for_tops(lp, shapes):
    """InputLayer / DummyDataLayer: one shape for every top, or one per top."""
    return [shapes[0] if len(shapes) == 1 else shapes[i] for i in range(len(lp.top))], []


def _input(lp, bottoms):
    return _shapes_for_tops(lp, [tuple(s.dim) for s in lp.input_param.shape])


def _dummy(lp, bottoms):
    dp = lp.dummy_data_param
    shapes = ([tuple(s.dim) for s in dp.shape] if len(dp.shape) else
              list(zip(dp.num, dp.channels, dp.height, dp.width)))
    return _shapes_for_tops(lp, shapes)


def _loss(lp, bottoms):
    """LossLayer: a 0-axis loss; SoftmaxWithLoss's second top is the probabilities."""
    return [()] + ([bottoms[0]] if len(lp.top) > 1 else []), []  # () even with no top given


_LOSSES = {"SoftmaxWithLoss", "EuclideanLoss", "SigmoidCrossEntropyLoss", "ContrastiveLoss"}


def _accuracy(lp, bottoms):
    axis = _canon(lp.accuracy_param.axis, len(bottoms[0]))
    return [()] + ([(bottoms[0][axis],)] if len(lp.top) > 1 else []), []


_SAME_SHAPE = {"ReLU", "Sigmoid", "TanH", "Dropout", "LRN", "Softmax", "Power", "AbsVal", "BNLL",
               "ELU", "Exp", "Log", "Threshold", "Clip", "Swish", "MVN", "Split"}
_ONE_BOTTOM = {"Convolution": _conv, "Deconvolution": _deconv, "Pooling": _pool,
               "InnerProduct": _inner_product, "BatchNorm": _batch_norm, "PReLU": _prelu,
               "Flatten": _flatten, "Reshape": _reshape, "Slice": _slice,
               "Embed": _embed}
_ALL_BOTTOMS = {"Concat": _concat, "Eltwise": _eltwise, "Scale": _scale, "Bias": _bias,
                "Crop": _crop, "Input": _input, "DummyData": _dummy, "SoftmaxWithLoss": _loss,
                "EuclideanLoss": _loss, "SigmoidCrossEntropyLoss": _loss, "ContrastiveLoss": _loss,
                "Accuracy": _accuracy, "LSTM": _recurrent, "RNN": _recurrent}


def _admits(state, lp):
    """Net::StateMeetsRule for each include/exclude rule (Net::FilterNet)."""
    def meets(rule):
        return ((not rule.HasField("phase") or rule.phase == state.phase)
                and (not rule.HasField("min_level") or state.level >= rule.min_level)
                and (not rule.HasField("max_level") or state.level <= rule.max_level)
                and all(s in state.stage for s in rule.stage)
                and not any(s in state.stage for s in rule.not_stage))
    if len(lp.include):
        return any(meets(r) for r in lp.include)
    return not any(meets(r) for r in lp.exclude)


def caffe_shapes(net_param, phase, given=None, input_shapes=None, stages=()):
    """({blob: shape}, {layer: [param shapes]}) of an upgraded NetParameter in ``phase``
    (and ``stages``).

    ``given`` maps a layer name (or, where two data layers share a name, a (name, type)
    pair) to its tops' shapes where the shape comes from data (Data, HDF5Data,
    ImageData, Python layers); ``input_shapes`` overrides Input layers' tops by blob name
    (a net reshaped after setup)."""
    state = caffe_pb2.NetState(phase=phase, stage=list(stages))
    given, input_shapes = given or {}, input_shapes or {}
    blobs, params = {}, {}
    for lp in net_param.layer:
        if not _admits(state, lp):
            continue
        bottoms = [blobs[b] for b in lp.bottom]
        if (lp.name, lp.type) in given or lp.name in given:
            tops, ps = given.get((lp.name, lp.type), given.get(lp.name)), []
        elif lp.type in _SAME_SHAPE:
            tops, ps = [bottoms[0]] * len(lp.top), []
        elif lp.type in _ONE_BOTTOM:
            tops, ps = _ONE_BOTTOM[lp.type](lp, bottoms[0])
        elif lp.type in _ALL_BOTTOMS:
            tops, ps = _ALL_BOTTOMS[lp.type](lp, bottoms)
        elif lp.type == "Silence":
            tops, ps = [], []
        else:
            raise KeyError(f"no shape rule for layer {lp.name!r} of type {lp.type}")
        names = list(lp.top)
        if not names and lp.type in _LOSSES:
            names = ["(automatic)"]     # Net::AppendTop for a layer whose AutoTopBlobs() holds
        for name, shape in zip(names, tops):
            blobs[name] = tuple(input_shapes.get(name, shape))
        if ps:
            params[lp.name] = [tuple(p) for p in ps]
    return blobs, params


# ------------------------------------------------- public files rebuilt character for character
def resnet152_places365_deploy():
    """CSAILVision/places365 deploy_resnet152_places365.prototxt (commit a4f9f6d6, 120,627
    characters; CC BY): KaimingHe's ResNet-152 deploy with a 365-way fc365, tab-indented,
    legacy ``input_dim``, BatchNorm with three ``param { lr_mult: 0.0 }``."""
    def conv(bottom, top, n, k, pad, stride):
        return (f'layer {{\n\tbottom: "{bottom}"\n\ttop: "{top}"\n\tname: "{top}"\n'
                f'\ttype: "Convolution"\n\tconvolution_param {{\n\t\tnum_output: {n}\n'
                f'\t\tkernel_size: {k}\n\t\tpad: {pad}\n\t\tstride: {stride}\n'
                '\t\tbias_term: false\n\t}\n}\n\n')

    def bn_scale(blob, suffix):
        return (f'layer {{\n\tbottom: "{blob}"\n\ttop: "{blob}"\n\tname: "bn{suffix}"\n'
                '\ttype: "BatchNorm"\n' + '  param {\n    lr_mult: 0.0\n  }\n' * 3 + '\n}\n\n'
                f'layer {{\n\tbottom: "{blob}"\n\ttop: "{blob}"\n\tname: "scale{suffix}"\n'
                '\ttype: "Scale"\n  param {\n    lr_mult: 1\n    decay_mult: 1\n  }\n'
                '  param {\n    lr_mult: 1\n    decay_mult: 0\n  }\n'
                '  scale_param {\n\n    bias_term: true\n  }\n}\n\n')

    def relu(blob, name, top_first=True):
        a, b = (f'\ttop: "{blob}"\n', f'\tbottom: "{blob}"\n')
        return f'layer {{\n{a + b if top_first else b + a}\tname: "{name}"\n\ttype: "ReLU"\n}}\n\n'

    def block(bottom, name, mid, out, stride, proj):
        sfx, s = name[3:], ""
        if proj:
            s += conv(bottom, f"{name}_branch1", out, 1, 0, stride)
            s += bn_scale(f"{name}_branch1", f"{sfx}_branch1")
        for br, src, n, k, pad, st in (("2a", bottom, mid, 1, 0, stride),
                                       ("2b", f"{name}_branch2a", mid, 3, 1, 1),
                                       ("2c", f"{name}_branch2b", out, 1, 0, 1)):
            s += conv(src, f"{name}_branch{br}", n, k, pad, st)
            s += bn_scale(f"{name}_branch{br}", f"{sfx}_branch{br}")
            if br != "2c":
                s += relu(f"{name}_branch{br}", f"{name}_branch{br}_relu")
        short = f"{name}_branch1" if proj else bottom
        s += (f'layer {{\n\tbottom: "{short}"\n\tbottom: "{name}_branch2c"\n\ttop: "{name}"\n'
              f'\tname: "{name}"\n\ttype: "Eltwise"\n}}\n\n')
        return s + relu(name, f"{name}_relu", top_first=False)

    s = ('name: "ResNet-152-places365"\ninput: "data"\ninput_dim: 10\ninput_dim: 3\n'
         'input_dim: 224\ninput_dim: 224\n')
    s += conv("data", "conv1", 64, 7, 3, 2) + bn_scale("conv1", "_conv1")
    s += relu("conv1", "conv1_relu")
    s += ('layer {\n\tbottom: "conv1"\n\ttop: "pool1"\n\tname: "pool1"\n\ttype: "Pooling"\n'
          '\tpooling_param {\n\t\tkernel_size: 3\n\t\tstride: 2\n\t\tpool: MAX\n\t}\n}\n\n')
    bottom = "pool1"
    for stage, (mid, n, numbered) in enumerate([(64, 3, False), (128, 8, True),
                                                (256, 36, True), (512, 3, False)], 2):
        for i in range(n):
            name = f"res{stage}b{i}" if numbered and i else f"res{stage}{'abc'[i]}"
            s += block(bottom, name, mid, mid * 4, 2 if i == 0 and stage > 2 else 1, i == 0)
            bottom = name
    s += ('layer {\n\tbottom: "res5c"\n\ttop: "pool5"\n\tname: "pool5"\n\ttype: "Pooling"\n'
          '\tpooling_param {\n\t\tkernel_size: 7\n\t\tstride: 1\n\t\tpool: AVE\n\t}\n}\n')
    s += ('layer {\n  name: "fc365"\n  type: "InnerProduct"\n  bottom: "pool5"\n  top: "fc365"\n'
          '  param {\n    lr_mult: 1.0\n    decay_mult: 1.0\n  }\n'
          '  param {\n    lr_mult: 2.0\n    decay_mult: 0.0\n  }\n'
          '  inner_product_param {\n    num_output: 365\n  }\n}\n')
    return s + 'layer {\n  name: "prob"\n  type: "Softmax"\n  bottom: "fc365"\n  top: "prob"\n}\n\n'


RESNET152_PLACES365_CHARS = 120627


def resnext50_32x4d_deploy(pool1_rounding="    ceil_mode: false\n"):
    """soeaver/caffe-model cls/resnext/deploy_resnext50_32x4d.prototxt (commit f5e243af,
    35,538 characters; MIT): grouped 3x3 convolutions (group 32), BatchNorm with
    use_global_stats, ``global_pooling : true``, and pool1 with the fork field
    ``ceil_mode: false`` (``pool1_rounding`` replaces that line)."""
    def conv(name, bottom, n, k, s, pad, group=None):
        g = f"    group: {group}\n" if group else ""
        return (f'layer {{\n  name: "{name}"\n  type: "Convolution"\n  bottom: "{bottom}"\n'
                f'  top: "{name}"\n  convolution_param {{\n    num_output: {n}\n'
                f'    kernel_size: {k}\n    stride: {s}\n{g}    pad: {pad}\n'
                '    bias_term: false\n  }\n}\n')

    def bn_scale(b):
        return (f'layer {{\n  name: "{b}_bn"\n  type: "BatchNorm"\n  bottom: "{b}"\n  top: "{b}"\n'
                '  batch_norm_param {\n    use_global_stats: true\n  }\n}\n'
                f'layer {{\n  name: "{b}_scale"\n  bottom: "{b}"\n  top: "{b}"\n  type: "Scale"\n'
                '  scale_param {\n    bias_term: true\n  }\n}\n')

    def relu(n, b):
        return f'layer {{\n  name: "{n}"\n  type: "ReLU"\n  bottom: "{b}"\n  top: "{b}"\n}}\n'

    s = 'input: "data"\ninput_shape {\n  dim: 1\n  dim: 3\n  dim: 224\n  dim: 224\n}\n'
    s += ('layer {\n  name: "conv1"\n  type: "Convolution"\n  bottom: "data"\n  top: "conv1"\n'
          '  convolution_param {\n    num_output: 64\n    kernel_size: 7\n    stride: 2\n'
          '    pad: 3\n    bias_term: false\n  }\n}\n')
    s += bn_scale("conv1") + relu("conv1_relu", "conv1")
    s += ('layer {\n  name: "pool1"\n  type: "Pooling"\n  bottom: "conv1"\n  top: "pool1"\n'
          '  pooling_param {\n    pool: MAX\n    kernel_size: 3\n    stride: 2\n    pad: 1\n'
          + pool1_rounding + '  }\n}\n')
    prev, i = "pool1", 0
    for stage, (mid, out, n) in enumerate([(128, 256, 3), (256, 512, 4), (512, 1024, 6),
                                           (1024, 2048, 3)]):
        for b in range(n):
            i += 1
            p, stride = f"resx{i}", 2 if b == 0 and stage > 0 else 1
            s += conv(f"{p}_conv1", prev, mid, 1, 1, 0) + bn_scale(f"{p}_conv1")
            s += relu(f"{p}_conv1_relu", f"{p}_conv1")
            s += conv(f"{p}_conv2", f"{p}_conv1", mid, 3, stride, 1, 32) + bn_scale(f"{p}_conv2")
            s += relu(f"{p}_conv2_relu", f"{p}_conv2")
            s += conv(f"{p}_conv3", f"{p}_conv2", out, 1, 1, 0) + bn_scale(f"{p}_conv3")
            if b == 0:
                s += conv(f"{p}_match_conv", prev, out, 1, stride, 0) + bn_scale(f"{p}_match_conv")
            pair = (f"{p}_match_conv" if b == 0 else prev, f"{p}_conv3")
            s += (f'layer {{\n  name: "{p}_elewise"\n  type: "Eltwise"\n  bottom: "{pair[0]}"\n'
                  f'  bottom: "{pair[1]}"\n  top: "{p}_elewise"\n'
                  '  eltwise_param {\n    operation: SUM\n  }\n}\n')
            s += relu(f"{p}_elewise_relu", f"{p}_elewise")
            prev = f"{p}_elewise"
    s += (f'layer {{\n  name: "pool_ave"\n  type: "Pooling"\n  bottom: "{prev}"\n'
          '  top: "pool_ave"\n'
          '  pooling_param {\n    global_pooling : true\n    pool: AVE\n  }\n}\n')
    s += ('layer {\n  name: "classifier"\n  type: "InnerProduct"\n  bottom: "pool_ave"\n'
          '  top: "classifier"\n  param {\n    lr_mult: 1\n    decay_mult: 1\n  }\n'
          '  param {\n    lr_mult: 2\n    decay_mult: 0\n  }\n'
          '  inner_product_param {\n    num_output: 1000\n    weight_filler {\n'
          '      type: "xavier"\n    }\n    bias_filler {\n      type: "constant"\n'
          '      value: 0\n    }\n  }\n}\n')
    return s + ('layer {\n  name: "prob"\n  type: "Softmax"\n  bottom: "classifier"\n'
                '  top: "prob"\n}\n\n')


RESNEXT50_CHARS = 35538


def open_nsfw_deploy():
    """yahoo/open_nsfw nsfw_model/deploy.prototxt as stored in the fork morotyo/open_nsfw
    (commit f1a24caf, 60,602 characters; BSD-2): ResNet-50 at half width ("1by2"), a
    2-way fc_nsfw whose bias filler is a xavier filler."""
    params = ('  param {\n    lr_mult: 1\n    decay_mult: 1\n  }\n'
              '  param {\n    lr_mult: 2\n    decay_mult: 0\n  }\n')
    fillers = ('    weight_filler {\n      type: "xavier"\n    }\n'
               '    bias_filler {\n      type: "constant"\n      value: 0\n    }\n')

    def conv(name, bottom, n, pad, k, s):
        return (f'layer {{\n  name: "{name}"\n  type: "Convolution"\n  bottom: "{bottom}"\n'
                f'  top: "{name}"\n' + params + f'  convolution_param {{\n    num_output: {n}\n'
                f'    pad: {pad}\n    kernel_size: {k}\n    stride: {s}\n' + fillers + '  }\n}\n')

    def bn_scale(bn, sc, b):
        return (f'layer {{\n  name: "{bn}"\n  type: "BatchNorm"\n  bottom: "{b}"\n  top: "{b}"\n'
                + '  param {\n    lr_mult: 0\n    decay_mult: 0\n  }\n' * 3
                + '  batch_norm_param {\n    use_global_stats: true\n  }\n}\n'
                f'layer {{\n  name: "{sc}"\n  type: "Scale"\n  bottom: "{b}"\n  top: "{b}"\n'
                '  scale_param {\n    bias_term: true\n  }\n}\n')

    def relu(n, b):
        return f'layer {{\n  name: "{n}"\n  type: "ReLU"\n  bottom: "{b}"\n  top: "{b}"\n}}\n'

    s = ('name: "ResNet_50_1by2_nsfw"\nlayer {\n  name: "data"\n  type: "Input"\n'
         '  top: "data"\n  input_param { shape: { dim: 1 dim: 3 dim: 224 dim: 224 } }\n}\n')
    s += conv("conv_1", "data", 64, 3, 7, 2) + bn_scale("bn_1", "scale_1", "conv_1")
    s += relu("relu_1", "conv_1")
    s += ('layer {\n  name: "pool1"\n  type: "Pooling"\n  bottom: "conv_1"\n  top: "pool1"\n'
          '  pooling_param {\n    pool: MAX\n    kernel_size: 3\n    stride: 2\n  }\n}\n')
    prev = "pool1"
    for st, (mid, out, n) in enumerate([(32, 128, 3), (64, 256, 4), (128, 512, 6),
                                        (256, 1024, 3)]):
        for b in range(n):
            p, stride = f"stage{st}_block{b}", 2 if b == 0 and st > 0 else 1
            if b == 0:
                c = f"conv_{p}_proj_shortcut"
                s += conv(c, prev, out, 0, 1, stride)
                s += bn_scale(f"bn_{p}_proj_shortcut", f"scale_{p}_proj_shortcut", c)
            for br, src, n_out, pad, k, strd in (
                    ("2a", prev, mid, 0, 1, stride), ("2b", f"conv_{p}_branch2a", mid, 1, 3, 1),
                    ("2c", f"conv_{p}_branch2b", out, 0, 1, 1)):
                c = f"conv_{p}_branch{br}"
                s += conv(c, src, n_out, pad, k, strd)
                s += bn_scale(f"bn_{p}_branch{br}", f"scale_{p}_branch{br}", c)
                if br != "2c":
                    s += relu(f"relu_{p}_branch{br}", c)
            short = f"conv_{p}_proj_shortcut" if b == 0 else prev
            s += (f'layer {{\n  name: "eltwise_{p}"\n  type: "Eltwise"\n  bottom: "{short}"\n'
                  f'  bottom: "conv_{p}_branch2c"\n  top: "eltwise_{p}"\n}}\n')
            s += relu(f"relu_{p}", f"eltwise_{p}")
            prev = f"eltwise_{p}"
    s += (f'layer {{\n  name: "pool"\n  type: "Pooling"\n  bottom: "{prev}"\n  top: "pool"\n'
          '  pooling_param {\n    pool: AVE\n    kernel_size: 7\n    stride: 1\n  }\n}\n')
    s += ('layer {\n  name: "fc_nsfw"\n  type: "InnerProduct"\n  bottom: "pool"\n  top: "fc_nsfw"\n'
          '  param {\n    lr_mult: 5\n    decay_mult: 1\n  }\n'
          '  param {\n    lr_mult: 10\n    decay_mult: 0\n  }\n'
          '  inner_product_param{\n    num_output: 2\n    weight_filler {\n      type: "xavier"\n'
          '      std: 0.01\n    }\n    bias_filler {\n      type: "xavier"\n      value: 0\n'
          '    }\n  }\n}\n')
    return s + ('layer {\n  name: "prob"\n  type: "Softmax"\n  bottom: "fc_nsfw"\n'
                '  top: "prob"\n}\n\n')


OPEN_NSFW_CHARS = 60602


def vgg_face_deploy_v1():
    """The Oxford VGG-Face VGG_FACE_deploy.prototxt (CC BY-NC, so not kept here), in its
    legacy V1 form (``layers``, enum types, ``input_dim``) as stored in
    KaiJin1995/MTCNN-VGG-face (commit 67a1671f) up to fc7, and with the original's
    relu7, drop7, fc8 (2622 identities) and prob, which that copy comments out (the
    upgraded copy in Arjun-Arora/Matroid_Asst keeps them)."""
    def layer(bottom, top, name, typ, body=""):
        return (f'layers {{\n  bottom: "{bottom}"\n  top: "{top}"\n  name: "{name}"\n'
                f'  type: {typ}\n{body}}}\n')

    def conv(b, n, k):
        return layer(b, n, n, "CONVOLUTION",
                     f"  convolution_param {{\n    num_output: {k}\n    pad: 1\n"
                     "    kernel_size: 3\n  }\n")

    s = ('name: "VGG_FACE_16_layers"\ninput: "data"\ninput_dim: 1\ninput_dim: 3\n'
         'input_dim: 224\ninput_dim: 224\n')
    bottom = "data"
    for b, (n, reps) in enumerate([(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)], 1):
        for r in range(1, reps + 1):
            s += conv(bottom, f"conv{b}_{r}", n)
            s += layer(f"conv{b}_{r}", f"conv{b}_{r}", f"relu{b}_{r}", "RELU")
            bottom = f"conv{b}_{r}"
        s += layer(bottom, f"pool{b}", f"pool{b}", "POOLING",
                   "  pooling_param {\n    pool: MAX\n    kernel_size: 2\n    stride: 2\n  }\n")
        bottom = f"pool{b}"
    for fc, src, n in (("fc6", "pool5", 4096), ("fc7", "fc6", 4096)):
        s += layer(src, fc, fc, "INNER_PRODUCT",
                   f"  inner_product_param {{\n    num_output: {n}\n  }}\n")
        s += layer(fc, fc, f"relu{fc[2]}", "RELU")
        s += layer(fc, fc, f"drop{fc[2]}", "DROPOUT",
                   "  dropout_param {\n    dropout_ratio: 0.5\n  }\n")
    s += layer("fc7", "fc8", "fc8", "INNER_PRODUCT",
               "  inner_product_param {\n    num_output: 2622\n  }\n")
    return s + layer("fc8", "prob", "prob", "SOFTMAX")


# Dong et al.'s SRCNN_net.prototxt (the 9-1-5 network), as quoted in full by Tarek Allam,
# "Programatically define nets with PyCaffe" (2016); its licence is not stated, so the text
# is rebuilt here rather than kept as a file.
SRCNN_NET = """name: "SRCNN"
layer {
  name: "data"
  type: "HDF5Data"
  top: "data"
  top: "label"
  hdf5_data_param {
    source: "examples/SRCNN/train.txt"
    batch_size: 128
  }
  include: { phase: TRAIN }
}
layer {
  name: "data"
  type: "HDF5Data"
  top: "data"
  top: "label"
  hdf5_data_param {
    source: "examples/SRCNN/test.txt"
    batch_size: 2
  }
  include: { phase: TEST }
}
""" + "".join(
    f"""
layer {{
  name: "conv{i}"
  type: "Convolution"
  bottom: "{bottom}"
  top: "conv{i}"
  param {{
    lr_mult: {lr_w}
  }}
  param {{
    lr_mult: 0.1
  }}
  convolution_param {{
    num_output: {n}
    kernel_size: {k}
    stride: 1
    pad: 0
    weight_filler {{
      type: "gaussian"
      std: 0.001
    }}
    bias_filler {{
      type: "constant"
      value: 0
    }}
  }}
}}
""" + (f"""
layer {{
  name: "relu{i}"
  type: "ReLU"
  bottom: "conv{i}"
  top: "conv{i}"
}}
""" if i < 3 else "")
    for i, bottom, lr_w, n, k in ((1, "data", 1, 64, 9), (2, "conv1", 1, 32, 1),
                                  (3, "conv2", 0.1, 1, 5))) + """
layer {
  name: "loss"
  type: "EuclideanLoss"
  bottom: "conv3"
  bottom: "label"
  top: "loss"
}
"""
