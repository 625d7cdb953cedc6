"""A seeded fuzz of the legacy-format upgrade against a reference written from BVLC Caffe's
src/caffe/util/upgrade_proto.cpp (master: UpgradeNetAsNeeded = V0 -> V1, data transformation,
V1 -> V2, legacy input, old BatchNorm; UpgradeSolverAsNeeded = solver_type -> type).

The reference below follows Caffe's C++ statement by statement, with protobuf's ``mutable_x()``
written as ``x.SetInParent()`` (it makes an empty sub-message present, which shows in the
upgraded prototxt as ``x {\n}``), and shares nothing with minicaffe.proto.upgrade but the schema.

Cases (all from fixed seeds):

* 48 V1 nets (``layers { type: CONVOLUTION ... }``): every V1LayerParameter.LayerType, each
  layer with random per-type parameter messages (filled from the schema, so every field of
  e.g. convolution_param or window_data_param occurs), sometimes an unrelated parameter
  message, transform_param and loss_param; 0-3 ``blobs_lr``, ``weight_decay``, ``param``
  names and ``blob_share_mode`` each, independently (so fewer or more than the layer's blobs);
  random ``include``/``exclude`` rules and ``loss_weight``; the legacy transformation fields
  (scale, mean_file, crop_size, mirror) in data_param / image_data_param / window_data_param,
  alone or with a transform_param of their own; net-level ``input`` with ``input_dim`` (also
  surplus values), ``input_shape`` (also surplus shapes, or with input_dim), or alone (a legacy
  .caffemodel), plus force_backward, state, debug_info.  Written as text, parsed by minicaffe.
* 16 V0 nets (``layers { layer { type: 'conv' ... } }``): every V0 type, ``padding`` layers
  folded into the conv/pool that reads them, the flat V0 fields set on matching and on
  non-matching types (Caffe drops those), blobs_lr/weight_decay, V0 transform fields, and
  net-level fields that Caffe's UpgradeV0Net keeps (name, input, input_dim, force_backward)
  and drops (input_shape, state, debug_info, new-style ``layer``).
* 8 current-format nets with legacy ``input`` fields and BatchNorm layers of 2, 3 or 4 params.
* 4 binary V1 ``.caffemodel``s (blobs with legacy num/channels/height/width or ``shape``)
  upgraded identically and loaded into the net built from the upgraded prototxt.
* solver_type: every enum value with random other fields, both fields given, type alone.
"""
import random

import numpy as np
import pytest
from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor as FD

from minicaffe.proto import caffe_pb2 as pb
from minicaffe.proto import parse_text, upgrade_net, upgrade_solver

V1 = pb.V1LayerParameter


# ============================================================ reference (upgrade_proto.cpp)

def ref_upgrade_v1_layer_type(t):
    """UpgradeV1LayerType."""
    return {
        V1.NONE: "", V1.ABSVAL: "AbsVal", V1.ACCURACY: "Accuracy", V1.ARGMAX: "ArgMax",
        V1.BNLL: "BNLL", V1.CONCAT: "Concat", V1.CONTRASTIVE_LOSS: "ContrastiveLoss",
        V1.CONVOLUTION: "Convolution", V1.DECONVOLUTION: "Deconvolution", V1.DATA: "Data",
        V1.DROPOUT: "Dropout", V1.DUMMY_DATA: "DummyData", V1.EUCLIDEAN_LOSS: "EuclideanLoss",
        V1.ELTWISE: "Eltwise", V1.EXP: "Exp", V1.FLATTEN: "Flatten", V1.HDF5_DATA: "HDF5Data",
        V1.HDF5_OUTPUT: "HDF5Output", V1.HINGE_LOSS: "HingeLoss", V1.IM2COL: "Im2col",
        V1.IMAGE_DATA: "ImageData", V1.INFOGAIN_LOSS: "InfogainLoss",
        V1.INNER_PRODUCT: "InnerProduct", V1.LRN: "LRN", V1.MEMORY_DATA: "MemoryData",
        V1.MULTINOMIAL_LOGISTIC_LOSS: "MultinomialLogisticLoss", V1.MVN: "MVN",
        V1.POOLING: "Pooling", V1.POWER: "Power", V1.RELU: "ReLU", V1.SIGMOID: "Sigmoid",
        V1.SIGMOID_CROSS_ENTROPY_LOSS: "SigmoidCrossEntropyLoss", V1.SILENCE: "Silence",
        V1.SOFTMAX: "Softmax", V1.SOFTMAX_LOSS: "SoftmaxWithLoss", V1.SPLIT: "Split",
        V1.SLICE: "Slice", V1.TANH: "TanH", V1.WINDOW_DATA: "WindowData",
        V1.THRESHOLD: "Threshold",
    }[t]


def ref_upgrade_v0_layer_type(t):
    """UpgradeV0LayerType (LOG(FATAL) on anything else)."""
    table = {"accuracy": V1.ACCURACY, "bnll": V1.BNLL, "concat": V1.CONCAT,
             "conv": V1.CONVOLUTION, "data": V1.DATA, "dropout": V1.DROPOUT,
             "euclidean_loss": V1.EUCLIDEAN_LOSS, "flatten": V1.FLATTEN,
             "hdf5_data": V1.HDF5_DATA, "hdf5_output": V1.HDF5_OUTPUT, "im2col": V1.IM2COL,
             "images": V1.IMAGE_DATA, "infogain_loss": V1.INFOGAIN_LOSS,
             "innerproduct": V1.INNER_PRODUCT, "lrn": V1.LRN,
             "multinomial_logistic_loss": V1.MULTINOMIAL_LOGISTIC_LOSS, "pool": V1.POOLING,
             "relu": V1.RELU, "sigmoid": V1.SIGMOID, "softmax": V1.SOFTMAX,
             "softmax_loss": V1.SOFTMAX_LOSS, "split": V1.SPLIT, "tanh": V1.TANH,
             "window_data": V1.WINDOW_DATA}
    if t not in table:
        raise ValueError(f"Unknown layer name: {t}")
    return table[t]


def ref_upgrade_v0_padding_layers(param):
    """UpgradeV0PaddingLayers."""
    out = pb.NetParameter()
    out.CopyFrom(param)
    out.ClearField("layers")
    last_top = {name: -1 for name in param.input}
    for i, conn in enumerate(param.layers):
        lp = conn.layer
        if lp.type != "padding":
            out.layers.add().CopyFrom(conn)
        for j, blob in enumerate(conn.bottom):
            if blob not in last_top:
                raise ValueError(f"Unknown blob input {blob} to layer {j}")
            top_idx = last_top[blob]
            if top_idx == -1:
                continue
            src = param.layers[top_idx]
            if src.layer.type == "padding":
                assert lp.type in ("conv", "pool")
                assert len(conn.bottom) == 1 and len(src.bottom) == 1 and len(src.top) == 1
                last = out.layers[len(out.layers) - 1]
                last.layer.pad = src.layer.pad
                last.bottom[j] = src.bottom[0]
        for blob in conn.top:
            last_top[blob] = i
    return out


# UpgradeV0LayerParameter's "if (has_X) { if (type == ...) ... else LOG(ERROR) }" blocks, in
# Caffe's order: V0 field -> [(V0 type, V1 message, its field)]. "+" marks add_x (repeated:
# ConvolutionParameter's pad, kernel_size, stride); master's PoolingParameter takes set_x.
_REF_V0 = [
    ("num_output", [("conv", "convolution_param", "num_output"),
                    ("innerproduct", "inner_product_param", "num_output")]),
    ("biasterm", [("conv", "convolution_param", "bias_term"),
                  ("innerproduct", "inner_product_param", "bias_term")]),
    ("weight_filler", [("conv", "convolution_param", "weight_filler"),
                       ("innerproduct", "inner_product_param", "weight_filler")]),
    ("bias_filler", [("conv", "convolution_param", "bias_filler"),
                     ("innerproduct", "inner_product_param", "bias_filler")]),
    ("pad", [("conv", "convolution_param", "+pad"), ("pool", "pooling_param", "pad")]),
    ("kernelsize", [("conv", "convolution_param", "+kernel_size"),
                    ("pool", "pooling_param", "kernel_size")]),
    ("group", [("conv", "convolution_param", "group")]),
    ("stride", [("conv", "convolution_param", "+stride"), ("pool", "pooling_param", "stride")]),
    ("pool", [("pool", "pooling_param", "pool")]),
    ("dropout_ratio", [("dropout", "dropout_param", "dropout_ratio")]),
    ("local_size", [("lrn", "lrn_param", "local_size")]),
    ("alpha", [("lrn", "lrn_param", "alpha")]),
    ("beta", [("lrn", "lrn_param", "beta")]),
    ("k", [("lrn", "lrn_param", "k")]),
    ("source", [("data", "data_param", "source"), ("hdf5_data", "hdf5_data_param", "source"),
                ("images", "image_data_param", "source"),
                ("window_data", "window_data_param", "source"),
                ("infogain_loss", "infogain_loss_param", "source")]),
    ("scale", None), ("meanfile", None),
    ("batchsize", [("data", "data_param", "batch_size"),
                   ("hdf5_data", "hdf5_data_param", "batch_size"),
                   ("images", "image_data_param", "batch_size"),
                   ("window_data", "window_data_param", "batch_size")]),
    ("cropsize", None), ("mirror", None),
    ("rand_skip", [("data", "data_param", "rand_skip"),
                   ("images", "image_data_param", "rand_skip")]),
    ("shuffle_images", [("images", "image_data_param", "shuffle")]),
    ("new_height", [("images", "image_data_param", "new_height")]),
    ("new_width", [("images", "image_data_param", "new_width")]),
    ("concat_dim", [("concat", "concat_param", "concat_dim")]),
    ("det_fg_threshold", [("window_data", "window_data_param", "fg_threshold")]),
    ("det_bg_threshold", [("window_data", "window_data_param", "bg_threshold")]),
    ("det_fg_fraction", [("window_data", "window_data_param", "fg_fraction")]),
    ("det_context_pad", [("window_data", "window_data_param", "context_pad")]),
    ("det_crop_mode", [("window_data", "window_data_param", "crop_mode")]),
]
_REF_V0_TRANSFORM = {"scale": "scale", "meanfile": "mean_file", "cropsize": "crop_size",
                     "mirror": "mirror"}


def ref_upgrade_v0_layer(conn):
    """UpgradeV0LayerParameter -> (V1LayerParameter, is_fully_compatible)."""
    ok = True
    out = V1()
    out.bottom.extend(conn.bottom)
    out.top.extend(conn.top)
    if conn.HasField("layer"):
        v0 = conn.layer
        if v0.HasField("name"):
            out.name = v0.name
        t = v0.type
        if v0.HasField("type"):
            out.type = ref_upgrade_v0_layer_type(t)
        out.blobs.extend(v0.blobs)
        out.blobs_lr.extend(v0.blobs_lr)
        out.weight_decay.extend(v0.weight_decay)
        for field, targets in _REF_V0:
            if not v0.HasField(field):
                continue
            if targets is None:
                setattr(out.transform_param, _REF_V0_TRANSFORM[field], getattr(v0, field))
                continue
            for v0_type, msg, target in targets:
                if t == v0_type:
                    sub = getattr(out, msg)
                    sub.SetInParent()
                    value = getattr(v0, field)
                    if target.startswith("+"):
                        getattr(sub, target[1:]).append(value)
                    elif field.endswith("_filler"):
                        getattr(sub, target).CopyFrom(value)
                    else:
                        setattr(sub, target, value)   # V0 PoolMethod == PoolingParameter's
                    break
            else:
                ok = False
        if v0.HasField("hdf5_output_param"):
            if t == "hdf5_output":
                out.hdf5_output_param.CopyFrom(v0.hdf5_output_param)
            else:
                ok = False
    return out, ok


def ref_upgrade_v0_net(param):
    """UpgradeV0Net: net_param->Clear(), then name, layers, input, input_dim, force_backward."""
    padded = ref_upgrade_v0_padding_layers(param)
    out = pb.NetParameter()
    ok = True
    if padded.HasField("name"):
        out.name = padded.name
    for conn in padded.layers:
        v1, layer_ok = ref_upgrade_v0_layer(conn)
        out.layers.add().CopyFrom(v1)
        ok &= layer_ok
    out.input.extend(padded.input)
    out.input_dim.extend(padded.input_dim)
    if padded.HasField("force_backward"):
        out.force_backward = padded.force_backward
    return out, ok


_DATA_TYPES = {V1.DATA: "data_param", V1.IMAGE_DATA: "image_data_param",
               V1.WINDOW_DATA: "window_data_param"}
_XF = ("scale", "mean_file", "crop_size", "mirror")


def ref_net_needs_data_upgrade(net):
    return any(layer.type in _DATA_TYPES
               and any(getattr(layer, _DATA_TYPES[layer.type]).HasField(f) for f in _XF)
               for layer in net.layers)


def ref_upgrade_net_data_transformation(net):
    """CONVERT_LAYER_TRANSFORM_PARAM: mutable_<type>_param() and mutable_transform_param()
    are taken for every layer of the three types, whether or not it has a field to move."""
    for layer in net.layers:
        if layer.type in _DATA_TYPES:
            lp = getattr(layer, _DATA_TYPES[layer.type])
            lp.SetInParent()
            layer.transform_param.SetInParent()
            for f in _XF:
                if lp.HasField(f):
                    setattr(layer.transform_param, f, getattr(lp, f))
                    lp.ClearField(f)


_REF_V1_COPIED = (
    "accuracy_param", "argmax_param", "concat_param", "contrastive_loss_param",
    "convolution_param", "data_param", "dropout_param", "dummy_data_param", "eltwise_param",
    "exp_param", "hdf5_data_param", "hdf5_output_param", "hinge_loss_param", "image_data_param",
    "infogain_loss_param", "inner_product_param", "lrn_param", "memory_data_param", "mvn_param",
    "pooling_param", "power_param", "relu_param", "sigmoid_param", "softmax_param",
    "slice_param", "tanh_param", "threshold_param", "window_data_param", "transform_param",
    "loss_param")


def ref_upgrade_v1_layer(v1):
    """UpgradeV1LayerParameter."""
    out = pb.LayerParameter()
    out.bottom.extend(v1.bottom)
    out.top.extend(v1.top)
    if v1.HasField("name"):
        out.name = v1.name
    for r in v1.include:
        out.include.add().CopyFrom(r)
    for r in v1.exclude:
        out.exclude.add().CopyFrom(r)
    if v1.HasField("type"):
        out.type = ref_upgrade_v1_layer_type(v1.type)
    for b in v1.blobs:
        out.blobs.add().CopyFrom(b)

    def param(i):
        while len(out.param) <= i:
            out.param.add()
        return out.param[i]
    for i, name in enumerate(v1.param):
        param(i).name = name
    for i, mode in enumerate(v1.blob_share_mode):
        param(i).share_mode = {V1.STRICT: pb.ParamSpec.STRICT,
                               V1.PERMISSIVE: pb.ParamSpec.PERMISSIVE}[mode]
    for i, lr in enumerate(v1.blobs_lr):
        param(i).lr_mult = lr
    for i, decay in enumerate(v1.weight_decay):
        param(i).decay_mult = decay
    out.loss_weight.extend(v1.loss_weight)
    for f in _REF_V1_COPIED:
        if v1.HasField(f):
            getattr(out, f).SetInParent()
            getattr(out, f).CopyFrom(getattr(v1, f))
    return out


def ref_upgrade_v1_net(net):
    """UpgradeV1Net (master: LOG(FATAL) "Refusing to upgrade inconsistent NetParameter")."""
    if len(net.layer) > 0:
        raise ValueError("Refusing to upgrade inconsistent NetParameter input")
    out = pb.NetParameter()
    out.CopyFrom(net)
    out.ClearField("layers")
    out.ClearField("layer")
    for v1 in net.layers:
        out.layer.add().CopyFrom(ref_upgrade_v1_layer(v1))
    return out


def ref_upgrade_net_input(net):
    """UpgradeNetInput: the Input layer is appended, then swapped to the front."""
    has_shape, has_dim = len(net.input_shape) > 0, len(net.input_dim) > 0
    if has_shape or has_dim:
        lp = net.layer.add()
        lp.name = "input"
        lp.type = "Input"
        ip = lp.input_param
        ip.SetInParent()
        for i, name in enumerate(net.input):
            lp.top.append(name)
            if has_shape:
                ip.shape.add().CopyFrom(net.input_shape[i])
            else:
                shape = ip.shape.add()
                for j in range(4 * i, 4 * i + 4):
                    shape.dim.append(net.input_dim[j])
        layers = list(net.layer)
        layers = [layers[-1]] + layers[:-1]
        copies = [pb.LayerParameter.FromString(x.SerializeToString()) for x in layers]
        net.ClearField("layer")
        net.layer.extend(copies)
    net.ClearField("input")
    net.ClearField("input_shape")
    net.ClearField("input_dim")


def ref_upgrade_net_as_needed(param):
    """UpgradeNetAsNeeded (master) -> (upgraded NetParameter, success)."""
    net = pb.NetParameter()
    net.CopyFrom(param)
    ok = True
    if any(layer.HasField("layer") for layer in net.layers):
        net, ok = ref_upgrade_v0_net(net)
    if ref_net_needs_data_upgrade(net):
        ref_upgrade_net_data_transformation(net)
    if len(net.layers) > 0:
        net = ref_upgrade_v1_net(net)
    if len(net.input) > 0:
        ref_upgrade_net_input(net)
    for layer in net.layer:     # NetNeedsBatchNormUpgrade / UpgradeNetBatchNorm
        if layer.type == "BatchNorm" and len(layer.param) == 3:
            for spec in layer.param:
                spec.lr_mult = 0.0
                spec.decay_mult = 0.0
    return net, ok


def ref_upgrade_solver_type(solver):
    """UpgradeSolverAsNeeded / UpgradeSolverType."""
    out = pb.SolverParameter()
    out.CopyFrom(solver)
    if out.HasField("solver_type"):
        if out.HasField("type"):
            raise ValueError("old solver_type field (enum) and new type field (string) "
                             "cannot be both specified")
        S = pb.SolverParameter
        out.type = {S.SGD: "SGD", S.NESTEROV: "Nesterov", S.ADAGRAD: "AdaGrad",
                    S.RMSPROP: "RMSProp", S.ADADELTA: "AdaDelta", S.ADAM: "Adam"}[
                        out.solver_type]
        out.ClearField("solver_type")
    return out


# ============================================================================= generators

WORDS = ("a", "b", "c", "data", "label", "x1", "y_2", "conv", "fc", "p")


def fill_random(msg, rng, p=0.35, depth=0):
    """Set a random subset of ``msg``'s fields to random values (sub-messages to depth 2)."""
    for f in msg.DESCRIPTOR.fields:
        if rng.random() > p:
            continue
        if f.type == FD.TYPE_MESSAGE:
            if depth >= 2:
                continue
            if f.is_repeated:
                for _ in range(rng.randint(0, 2)):
                    fill_random(getattr(msg, f.name).add(), rng, p, depth + 1)
            else:
                sub = getattr(msg, f.name)
                sub.SetInParent()
                fill_random(sub, rng, p, depth + 1)
            continue
        values = [_random_scalar(f, rng) for _ in range(
            rng.randint(0, 3) if f.is_repeated else 1)]
        if f.is_repeated:
            getattr(msg, f.name).extend(values)
        else:
            setattr(msg, f.name, values[0])
    return msg


def _random_scalar(f, rng):
    if f.type == FD.TYPE_BOOL:
        return rng.random() < 0.5
    if f.type == FD.TYPE_STRING:
        return rng.choice(WORDS) + "/" + rng.choice(WORDS)
    if f.type == FD.TYPE_BYTES:
        return bytes(rng.randint(0, 255) for _ in range(3))
    if f.type == FD.TYPE_ENUM:
        return rng.choice(f.enum_type.values).number
    if f.type in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        return rng.choice((0.0, 0.5, 1.0, 2.0, 1e-4, 0.125, 3.0, 0.75))
    if f.type in (FD.TYPE_INT32, FD.TYPE_INT64, FD.TYPE_SINT32, FD.TYPE_SINT64):
        return rng.randint(-2, 9)
    return rng.randint(0, 9)


# V1 type -> the parameter message it reads
OWN_PARAM = {
    "CONVOLUTION": "convolution_param", "DECONVOLUTION": "convolution_param",
    "IM2COL": "convolution_param", "POOLING": "pooling_param",
    "INNER_PRODUCT": "inner_product_param", "LRN": "lrn_param", "DROPOUT": "dropout_param",
    "RELU": "relu_param", "SIGMOID": "sigmoid_param", "TANH": "tanh_param",
    "SOFTMAX": "softmax_param", "SOFTMAX_LOSS": "softmax_param",
    "ACCURACY": "accuracy_param", "ARGMAX": "argmax_param", "CONCAT": "concat_param",
    "CONTRASTIVE_LOSS": "contrastive_loss_param", "DATA": "data_param",
    "DUMMY_DATA": "dummy_data_param", "ELTWISE": "eltwise_param", "EXP": "exp_param",
    "HDF5_DATA": "hdf5_data_param", "HDF5_OUTPUT": "hdf5_output_param",
    "HINGE_LOSS": "hinge_loss_param", "IMAGE_DATA": "image_data_param",
    "INFOGAIN_LOSS": "infogain_loss_param", "MEMORY_DATA": "memory_data_param",
    "MVN": "mvn_param", "POWER": "power_param", "SLICE": "slice_param",
    "THRESHOLD": "threshold_param", "WINDOW_DATA": "window_data_param",
}
V1_TYPES = [t for t in V1.LayerType.keys()]
DATA_PARAMS = {"DATA": "data_param", "IMAGE_DATA": "image_data_param",
               "WINDOW_DATA": "window_data_param"}


def random_rule(rng):
    rule = pb.NetStateRule()
    if rng.random() < 0.6:
        rule.phase = rng.choice((pb.TRAIN, pb.TEST))
    if rng.random() < 0.3:
        rule.min_level = rng.randint(-1, 2)
    if rng.random() < 0.3:
        rule.max_level = rng.randint(0, 3)
    rule.stage.extend(rng.choice(WORDS) for _ in range(rng.randint(0, 2)))
    rule.not_stage.extend(rng.choice(WORDS) for _ in range(rng.randint(0, 1)))
    return rule


def random_v1_layer(rng, kind, i):
    layer = V1()
    if rng.random() < 0.95:
        layer.name = f"{kind.lower()}{i}"
    if rng.random() < 0.97:
        layer.type = V1.LayerType.Value(kind)
    layer.bottom.extend(rng.choice(WORDS) for _ in range(rng.randint(0, 3)))
    layer.top.extend(rng.choice(WORDS) for _ in range(rng.randint(0, 2)))
    layer.blobs_lr.extend(rng.choice((0.0, 1.0, 2.0, 0.1)) for _ in range(rng.randint(0, 3)))
    layer.weight_decay.extend(rng.choice((0.0, 1.0, 0.5)) for _ in range(rng.randint(0, 3)))
    layer.param.extend(f"w{rng.randint(0, 3)}" for _ in range(rng.choice((0, 0, 1, 2, 3))))
    layer.blob_share_mode.extend(rng.choice((V1.STRICT, V1.PERMISSIVE))
                                 for _ in range(rng.choice((0, 0, 0, 1, 2))))
    layer.loss_weight.extend(rng.choice((0.0, 1.0, 0.5)) for _ in range(rng.choice((0, 0, 1, 2))))
    for _ in range(rng.choice((0, 0, 1, 2))):
        layer.include.add().CopyFrom(random_rule(rng))
    for _ in range(rng.choice((0, 0, 0, 1))):
        layer.exclude.add().CopyFrom(random_rule(rng))
    own = OWN_PARAM.get(kind)
    if own is not None and rng.random() < 0.85:
        sub = getattr(layer, own)
        sub.SetInParent()
        fill_random(sub, rng)
    if kind in DATA_PARAMS:
        sub = getattr(layer, DATA_PARAMS[kind])
        for f in _XF:
            if rng.random() < 0.5:
                setattr(sub, f, _random_scalar(sub.DESCRIPTOR.fields_by_name[f], rng))
    if rng.random() < 0.25 or (kind in DATA_PARAMS and rng.random() < 0.4):
        layer.transform_param.SetInParent()
        fill_random(layer.transform_param, rng)
    if rng.random() < 0.15 or kind.endswith("_LOSS") and rng.random() < 0.5:
        layer.loss_param.SetInParent()
        fill_random(layer.loss_param, rng)
    if rng.random() < 0.1:   # a parameter message of another type: Caffe copies it all the same
        other = rng.choice(_REF_V1_COPIED)
        getattr(layer, other).SetInParent()
        fill_random(getattr(layer, other), rng)
    if rng.random() < 0.1:
        b = layer.blobs.add()
        b.shape.dim.extend([2, 3])
        b.data.extend([0.5] * 6)
    return layer


def random_net_inputs(net, rng):
    """Legacy input / input_dim / input_shape, in the forms Caffe reads."""
    form = rng.choice(("none", "none", "dim", "dim", "dim_surplus", "shape", "shape_surplus",
                       "shape_and_dim", "bare"))
    if form == "none":
        return
    n = rng.randint(1, 3)
    net.input.extend(f"in{k}" for k in range(n))
    if form.startswith("dim"):
        net.input_dim.extend(rng.randint(1, 9) for _ in range(4 * n))
        if form == "dim_surplus":
            net.input_dim.extend(rng.randint(1, 9) for _ in range(rng.randint(1, 3)))
    elif form.startswith("shape"):
        for _ in range(n + (rng.randint(1, 2) if form == "shape_surplus" else 0)):
            net.input_shape.add().dim.extend(rng.randint(1, 9) for _ in range(rng.randint(0, 4)))
        if form == "shape_and_dim":
            net.input_dim.extend(rng.randint(1, 9) for _ in range(4 * n))


def random_v1_net(seed):
    rng = random.Random(seed)
    net = pb.NetParameter()
    if rng.random() < 0.8:
        net.name = f"v1net{seed}"
    random_net_inputs(net, rng)
    if rng.random() < 0.3:
        net.force_backward = rng.random() < 0.5
    if rng.random() < 0.2:
        fill_random(net.state, rng)
    if rng.random() < 0.2:
        net.debug_info = True
    # every V1 type over the cases (two cases cover the list), plus random extra layers
    start = (seed * 21) % len(V1_TYPES)
    kinds = [V1_TYPES[(start + k) % len(V1_TYPES)] for k in range(21)]
    kinds += [rng.choice(V1_TYPES) for _ in range(rng.randint(0, 4))]
    rng.shuffle(kinds)
    for i, kind in enumerate(kinds):
        net.layers.add().CopyFrom(random_v1_layer(rng, kind, i))
    return net


V0_TYPES = ("accuracy", "bnll", "concat", "conv", "data", "dropout", "euclidean_loss",
            "flatten", "hdf5_data", "hdf5_output", "im2col", "images", "infogain_loss",
            "innerproduct", "lrn", "multinomial_logistic_loss", "pool", "relu", "sigmoid",
            "softmax", "softmax_loss", "split", "tanh", "window_data")
V0_FLAT = [f.name for f in pb.V0LayerParameter.DESCRIPTOR.fields
           if f.name not in ("name", "type", "blobs", "blobs_lr", "weight_decay")]


def random_v0_layer(rng, kind, i, bottoms, top):
    conn = V1()
    conn.bottom.extend(bottoms)
    conn.top.append(top)
    v0 = conn.layer
    v0.name = f"{kind}{i}"
    v0.type = kind
    v0.blobs_lr.extend(rng.choice((1.0, 2.0, 0.0)) for _ in range(rng.randint(0, 3)))
    v0.weight_decay.extend(rng.choice((1.0, 0.0)) for _ in range(rng.randint(0, 3)))
    if kind == "padding":
        if rng.random() < 0.8:
            v0.pad = rng.randint(0, 3)
        return conn
    # fields of every kind: those that belong to the type and (less often) those that do not
    for f in V0_FLAT:
        if rng.random() < 0.15:
            fd = pb.V0LayerParameter.DESCRIPTOR.fields_by_name[f]
            if fd.type == FD.TYPE_MESSAGE:
                getattr(v0, f).SetInParent()
                fill_random(getattr(v0, f), rng)
            else:
                setattr(v0, f, _random_scalar(fd, rng))
    if rng.random() < 0.2:
        b = v0.blobs.add()
        b.num, b.channels, b.height, b.width = 1, 1, 2, 2
        b.data.extend([1.0, 2.0, 3.0, 4.0])
    return conn


def random_v0_net(seed):
    rng = random.Random(1000 + seed)
    net = pb.NetParameter()
    net.name = f"v0net{seed}"
    net.input.append("data")
    if rng.random() < 0.7:
        net.input_dim.extend([2, 3, 8, 8])
    if rng.random() < 0.3:
        net.force_backward = True
    # fields UpgradeV0Net does not carry over
    if rng.random() < 0.25:
        net.input_shape.add().dim.extend([2, 3, 8, 8])
    if rng.random() < 0.2:
        net.state.phase = pb.TRAIN
    if rng.random() < 0.2:
        net.debug_info = True
    if rng.random() < 0.15:
        net.layer.add(name="new_style", type="ReLU", bottom=["data"], top=["data"])
    blobs = ["data"]
    kinds = list(V0_TYPES[(seed * 7) % 24:]) + list(V0_TYPES[:(seed * 7) % 24])
    kinds = kinds[:rng.randint(8, 16)]
    for i, kind in enumerate(kinds):
        if kind in ("conv", "pool") and rng.random() < 0.6:
            pad_top = f"pad{i}"
            net.layers.add().CopyFrom(
                random_v0_layer(rng, "padding", i, [rng.choice(blobs)], pad_top))
            net.layers.add().CopyFrom(random_v0_layer(rng, kind, i, [pad_top], f"t{i}"))
        else:
            bottoms = [rng.choice(blobs) for _ in range(rng.randint(0, 2))]
            net.layers.add().CopyFrom(random_v0_layer(rng, kind, i, bottoms, f"t{i}"))
        blobs.append(f"t{i}")
    if rng.random() < 0.2:      # a connection without a V0 layer: only bottom and top survive
        net.layers.add(name="bare", type=V1.RELU, bottom=["data"], top=["data"])
    return net


def random_current_net(seed):
    rng = random.Random(2000 + seed)
    net = pb.NetParameter(name=f"cur{seed}")
    random_net_inputs(net, rng)
    if not net.input:
        net.input.append("in0")
        net.input_dim.extend([2, 3, 4, 4])
    for i in range(rng.randint(1, 4)):
        lp = net.layer.add(name=f"bn{i}", type=rng.choice(("BatchNorm", "BatchNorm", "Scale")),
                           bottom=["in0"], top=[f"bn{i}"])
        for _ in range(rng.choice((0, 2, 3, 3, 4))):
            spec = lp.param.add()
            if rng.random() < 0.5:
                spec.name = rng.choice(WORDS)
            if rng.random() < 0.7:
                spec.lr_mult = rng.choice((0.0, 1.0, 2.0))
            if rng.random() < 0.5:
                spec.share_mode = pb.ParamSpec.PERMISSIVE
    return net


# ================================================================================== tests

def text(msg):
    return text_format.MessageToString(msg)


def assert_same(got, want):
    assert text(got) == text(want)
    assert got == want


N_V1, N_V0, N_CUR = 48, 16, 8


def test_cases_cover_every_v1_and_v0_type():
    v1 = {V1.LayerType.Name(layer.type) for s in range(N_V1)
          for layer in random_v1_net(s).layers if layer.HasField("type")}
    assert v1 == set(V1_TYPES)
    v0 = {conn.layer.type for s in range(N_V0) for conn in random_v0_net(s).layers}
    assert v0 >= set(V0_TYPES) | {"padding"}


@pytest.mark.parametrize("seed", range(N_V1))
def test_v1_net_upgrades_as_caffe_does(seed):
    given = random_v1_net(seed)
    parsed = parse_text(text(given), pb.NetParameter, filename=f"<v1 fuzz {seed}>")
    assert parsed == given
    want, ok = ref_upgrade_net_as_needed(parsed)
    assert ok
    got = upgrade_net(parsed)
    assert_same(got, want)
    assert upgrade_net(got) == got           # nothing left to upgrade
    assert parsed == given                   # the argument is left as it was


@pytest.mark.parametrize("seed", range(N_V0))
def test_v0_net_upgrades_as_caffe_does(seed):
    given = random_v0_net(seed)
    parsed = parse_text(text(given), pb.NetParameter, filename=f"<v0 fuzz {seed}>")
    want, ok = ref_upgrade_net_as_needed(parsed)
    problems = []
    got = upgrade_net(parsed, problems)
    assert_same(got, want)
    assert (not problems) == ok              # Caffe's is_fully_compatible


@pytest.mark.parametrize("seed", range(N_CUR))
def test_legacy_inputs_and_old_batch_norm_upgrade_as_caffe_does(seed):
    given = random_current_net(seed)
    want, _ = ref_upgrade_net_as_needed(given)
    assert_same(upgrade_net(given), want)


def test_v1_and_new_layers_together_are_refused_as_in_caffe_master():
    net = pb.NetParameter()
    net.layers.add(name="a", type=V1.RELU)
    net.layer.add(name="b", type="ReLU")
    with pytest.raises(ValueError):
        ref_upgrade_net_as_needed(net)
    with pytest.raises(ValueError, match="both V1 'layers'"):
        upgrade_net(net)


def test_data_upgrade_leaves_empty_param_messages_as_caffe_does():
    """Regression: CONVERT_LAYER_TRANSFORM_PARAM takes mutable_data_param() and
    mutable_transform_param() of every DATA/IMAGE_DATA/WINDOW_DATA layer once any layer has a
    field to move, so an upgraded prototxt shows ``transform_param {\n}`` on all of them."""
    net = parse_text("layers { name: 'd' type: DATA } "
                     "layers { name: 'w' type: WINDOW_DATA window_data_param { source: 's' } } "
                     "layers { name: 'i' type: IMAGE_DATA image_data_param { mirror: true } } "
                     "layers { name: 'r' type: RELU }", pb.NetParameter)
    got = upgrade_net(net)
    assert_same(got, ref_upgrade_net_as_needed(net)[0])
    d, w, i, r = got.layer
    assert d.HasField("data_param") and d.HasField("transform_param")
    assert w.HasField("transform_param") and i.HasField("image_data_param")
    assert i.transform_param.mirror and not r.HasField("transform_param")
    # no field to move anywhere: no data upgrade, no empty messages
    plain = parse_text("layers { name: 'd' type: DATA }", pb.NetParameter)
    assert not upgrade_net(plain).layer[0].HasField("transform_param")


def test_v0_upgrade_keeps_only_what_caffe_keeps():
    """Regression: UpgradeV0Net starts from net_param->Clear() and copies back the name, the
    layers, input, input_dim and force_backward only; input_shape, state, debug_info and
    new-style layers of a V0 file are gone (an input without input_dim then has no shape and
    is dropped, as in a legacy .caffemodel)."""
    net = parse_text("name: 'n' input: 'data' input_shape { dim: 1 dim: 2 } debug_info: true "
                     "state { phase: TRAIN } force_backward: true "
                     "layer { name: 'new' type: 'ReLU' bottom: 'data' top: 'data' } "
                     "layers { layer { name: 'r' type: 'relu' } bottom: 'data' top: 'data' }",
                     pb.NetParameter)
    got = upgrade_net(net)
    assert_same(got, ref_upgrade_net_as_needed(net)[0])
    assert [lp.name for lp in got.layer] == ["r"]
    assert got.force_backward and not got.HasField("state") and not got.debug_info


# ------------------------------------------------------------------------------ binary

def _binary_v1_net(seed):
    """A runnable V1 net and its .caffemodel: per layer the V1 definition with blobs."""
    rng = random.Random(3000 + seed)
    c, k, n = rng.randint(1, 3), rng.choice((1, 3)), rng.randint(2, 5)
    proto = f"""name: 'bin{seed}' input: 'data' input_dim: 2 input_dim: {c}
    input_dim: 6 input_dim: 6
    layers {{ name: 'conv' type: CONVOLUTION bottom: 'data' top: 'conv'
      blobs_lr: {rng.choice((1, 0))} {'blobs_lr: 2 weight_decay: 1 weight_decay: 0'
                                      if rng.random() < 0.5 else 'weight_decay: 1'}
      convolution_param {{ num_output: {n} kernel_size: {k} pad: {k // 2} }} }}
    layers {{ name: 'relu' type: RELU bottom: 'conv' top: 'conv' }}
    layers {{ name: 'pool' type: POOLING bottom: 'conv' top: 'pool'
      pooling_param {{ pool: {rng.choice(('MAX', 'AVE'))} kernel_size: 2 stride: 2 }} }}
    layers {{ name: 'fc' type: INNER_PRODUCT bottom: 'pool' top: 'fc'
      {'param: "shared_w" ' if rng.random() < 0.5 else ''}blobs_lr: 1
      inner_product_param {{ num_output: 3 }} }}"""
    model = parse_text(proto, pb.NetParameter)
    shapes = {"conv": [(n, c, k, k), (n,)], "fc": [(3, n * 9), (3,)]}
    values = {}
    for layer in model.layers:
        for shape in shapes.get(layer.name, []):
            arr = np.asarray([rng.uniform(-1, 1) for _ in range(int(np.prod(shape)))],
                             np.float32).reshape(shape)
            b = layer.blobs.add()
            if rng.random() < 0.5:    # the legacy 4-D blob header of old .caffemodels
                full = (1,) * (4 - len(shape)) + shape
                b.num, b.channels, b.height, b.width = full
            else:
                b.shape.dim.extend(shape)
            b.data.extend(arr.ravel().tolist())
            values.setdefault(layer.name, []).append(arr)
    return proto, model, values


@pytest.mark.parametrize("seed", range(4))
def test_binary_v1_caffemodel_upgrades_and_loads(tmp_path, seed):
    from minicaffe.net import Net
    proto, model, values = _binary_v1_net(seed)
    path = tmp_path / "v1.caffemodel"
    path.write_bytes(model.SerializeToString())
    loaded = pb.NetParameter.FromString(path.read_bytes())
    assert_same(upgrade_net(loaded), ref_upgrade_net_as_needed(loaded)[0])
    net = Net(upgrade_net(parse_text(proto, pb.NetParameter)), "TEST")
    net.copy_from(str(path))
    for name, arrays in values.items():
        assert len(net.params[name]) == len(arrays)
        for blob, arr in zip(net.params[name], arrays):
            np.testing.assert_array_equal(np.asarray(blob.data).reshape(arr.shape), arr)


# ------------------------------------------------------------------------------ solvers

@pytest.mark.parametrize("seed", range(12))
def test_solver_type_upgrades_as_caffe_does(seed):
    rng = random.Random(4000 + seed)
    solver = pb.SolverParameter()
    fill_random(solver, rng, p=0.2)
    for f in ("net_param", "train_net_param", "test_net_param", "type", "solver_type"):
        solver.ClearField(f)
    form = seed % 4
    if form in (0, 1, 2):
        solver.solver_type = pb.SolverParameter.SolverType.values()[seed % 6]
    if form == 2 or form == 3:
        solver.type = rng.choice(("SGD", "Adam", "Custom"))
    parsed = parse_text(text(solver), pb.SolverParameter)
    if form == 2:       # CHECK(!has_solver_type() || !has_type())
        with pytest.raises(ValueError):
            ref_upgrade_solver_type(parsed)
        with pytest.raises(ValueError, match="both"):
            upgrade_solver(parsed)
        return
    assert_same(upgrade_solver(parsed), ref_upgrade_solver_type(parsed))
