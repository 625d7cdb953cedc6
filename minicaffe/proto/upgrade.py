"""Caffe's upgrade of deprecated net and solver definitions (src/caffe/util/upgrade_proto.cpp).

Caffe reads old files by rewriting them into the current schema right after parsing, and minicaffe
does the same, in Caffe's order:

1. V0 nets (``layers { layer { ... } }``, 2013) become V1 nets (UpgradeV0Net): a ``padding``
   layer is folded into the convolution or pooling that reads it (its ``pad``, and its bottom
   instead of its top), the lowercase type names become the V1 enum (``conv`` CONVOLUTION,
   ``innerproduct`` INNER_PRODUCT, ``images`` IMAGE_DATA, ...), and each flat V0 field goes to
   its type's parameter message (``kernelsize`` to ``kernel_size``, ``batchsize`` to
   ``batch_size``, ``det_fg_threshold`` to ``window_data_param.fg_threshold``, ``scale``,
   ``meanfile``, ``cropsize``, ``mirror`` to ``transform_param``).  A field that does not
   belong to its layer's type is dropped with a warning, as Caffe logs it and goes on; an
   unknown type is an error, as in Caffe.  The net keeps only its name, ``input``,
   ``input_dim`` and ``force_backward`` (UpgradeV0Net clears the rest).
2. Data-layer transformation fields of V1 layers (``scale``, ``mean_file``, ``crop_size``,
   ``mirror`` in ``data_param``/``image_data_param``/``window_data_param``) move into
   ``transform_param``.
3. V1 ``layers`` become ``layer``: the type enum becomes the registry string, ``blobs_lr`` and
   ``weight_decay`` become ``param { lr_mult decay_mult }``, parameter names and share modes move
   into the same ParamSpec, and per-type parameters, rules, loss weights and blobs are copied.
4. Legacy ``input``/``input_shape``/``input_dim`` become one ``Input`` layer at the front.
5. Old-style BatchNorm layers, which had to declare three ``param`` entries to freeze their
   statistics, get lr_mult = decay_mult = 0 on those entries (what upstream master does; the
   parameters keep their names so sharing still works).

Solvers: the ``solver_type`` enum becomes the ``type`` string.

The functions return upgraded copies and leave their arguments untouched. Malformed input raises
ValueError naming the layer and the field.
"""

import logging

from . import caffe_pb2

logger = logging.getLogger(__name__)

# V1LayerParameter.LayerType name -> LayerParameter.type string (UpgradeV1LayerType).
V1_LAYER_TYPES = {
    "NONE": "",
    "ABSVAL": "AbsVal",
    "ACCURACY": "Accuracy",
    "ARGMAX": "ArgMax",
    "BNLL": "BNLL",
    "CONCAT": "Concat",
    "CONTRASTIVE_LOSS": "ContrastiveLoss",
    "CONVOLUTION": "Convolution",
    "DECONVOLUTION": "Deconvolution",
    "DATA": "Data",
    "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData",
    "EUCLIDEAN_LOSS": "EuclideanLoss",
    "ELTWISE": "Eltwise",
    "EXP": "Exp",
    "FLATTEN": "Flatten",
    "HDF5_DATA": "HDF5Data",
    "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss",
    "IM2COL": "Im2col",
    "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss",
    "INNER_PRODUCT": "InnerProduct",
    "LRN": "LRN",
    "MEMORY_DATA": "MemoryData",
    "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN",
    "POOLING": "Pooling",
    "POWER": "Power",
    "RELU": "ReLU",
    "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss",
    "SILENCE": "Silence",
    "SOFTMAX": "Softmax",
    "SOFTMAX_LOSS": "SoftmaxWithLoss",
    "SPLIT": "Split",
    "SLICE": "Slice",
    "TANH": "TanH",
    "WINDOW_DATA": "WindowData",
    "THRESHOLD": "Threshold",
}

# Per-type parameter messages that V1LayerParameter and LayerParameter share by name; copied as they
# are (UpgradeV1LayerParameter).
_V1_PARAM_FIELDS = (
    "accuracy_param", "argmax_param", "concat_param", "contrastive_loss_param",
    "convolution_param", "data_param", "dropout_param", "dummy_data_param", "eltwise_param",
    "exp_param", "hdf5_data_param", "hdf5_output_param", "hinge_loss_param", "image_data_param",
    "infogain_loss_param", "inner_product_param", "lrn_param", "memory_data_param", "mvn_param",
    "pooling_param", "power_param", "relu_param", "sigmoid_param", "softmax_param", "slice_param",
    "tanh_param", "threshold_param", "window_data_param", "transform_param", "loss_param",
)

# V1 data layers whose own parameter message still carried the transformation fields.
_V1_DATA_PARAM_FIELDS = {
    caffe_pb2.V1LayerParameter.DATA: "data_param",
    caffe_pb2.V1LayerParameter.IMAGE_DATA: "image_data_param",
    caffe_pb2.V1LayerParameter.WINDOW_DATA: "window_data_param",
}
_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")

_SOLVER_TYPES = {
    caffe_pb2.SolverParameter.SGD: "SGD",
    caffe_pb2.SolverParameter.NESTEROV: "Nesterov",
    caffe_pb2.SolverParameter.ADAGRAD: "AdaGrad",
    caffe_pb2.SolverParameter.RMSPROP: "RMSProp",
    caffe_pb2.SolverParameter.ADADELTA: "AdaDelta",
    caffe_pb2.SolverParameter.ADAM: "Adam",
}


# ---------------------------------------------------------------------------------------- checks

def net_needs_v0_upgrade(net_param):
    """True iff some V1 layer wraps a V0 layer definition (NetNeedsV0ToV1Upgrade)."""
    return any(layer.HasField("layer") for layer in net_param.layers)


def net_needs_data_upgrade(net_param):
    """True iff a V1 data layer keeps transformation fields in its own parameter message."""
    for layer in net_param.layers:
        field = _V1_DATA_PARAM_FIELDS.get(layer.type)
        if field is not None:
            param = getattr(layer, field)
            if any(param.HasField(f) for f in _TRANSFORM_FIELDS):
                return True
    return False


def net_needs_v1_upgrade(net_param):
    """True iff the net uses V1 ``layers`` (NetNeedsV1ToV2Upgrade)."""
    return len(net_param.layers) > 0


def net_needs_input_upgrade(net_param):
    """True iff the net declares legacy ``input`` fields (NetNeedsInputUpgrade)."""
    return len(net_param.input) > 0


def net_needs_batch_norm_upgrade(net_param):
    """True iff a BatchNorm layer declares the three ParamSpecs of the old definition."""
    return any(layer.type == "BatchNorm" and len(layer.param) == 3 for layer in net_param.layer)


def net_needs_upgrade(net_param):
    """True iff upgrade_net would change ``net_param`` (NetNeedsUpgrade)."""
    return (net_needs_v0_upgrade(net_param) or net_needs_data_upgrade(net_param)
            or net_needs_v1_upgrade(net_param) or net_needs_input_upgrade(net_param)
            or net_needs_batch_norm_upgrade(net_param))


# -------------------------------------------------------------------------------------- upgrades

def _upgrade_data_transformation(net):
    """Move V1 data layers' scale/mean_file/crop_size/mirror into transform_param (in place)."""
    for layer in net.layers:
        field = _V1_DATA_PARAM_FIELDS.get(layer.type)
        if field is None:
            continue
        param = getattr(layer, field)
        # Caffe's CONVERT_LAYER_TRANSFORM_PARAM (upgrade_proto.cpp) takes mutable_<type>_param()
        # and mutable_transform_param() of every layer of the three types, so each ends with
        # both messages present, if empty (the upgraded prototxt shows "transform_param {}").
        param.SetInParent()
        layer.transform_param.SetInParent()
        for name in _TRANSFORM_FIELDS:
            if param.HasField(name):
                setattr(layer.transform_param, name, getattr(param, name))
                param.ClearField(name)


def _param_spec(layer, index):
    """The layer's ParamSpec ``index``, adding defaults before it as Caffe's loop does."""
    while len(layer.param) <= index:
        layer.param.add()
    return layer.param[index]


def upgrade_v1_layer(v1_layer, index=0):
    """Convert one V1LayerParameter into a LayerParameter (UpgradeV1LayerParameter)."""
    label = f'layers {index} ("{v1_layer.name}")' if v1_layer.name else f"layers {index}"
    if v1_layer.HasField("layer"):
        raise ValueError(f"{label} holds a V0 layer definition (upgrade_net upgrades it first)")
    layer = caffe_pb2.LayerParameter()
    layer.bottom.extend(v1_layer.bottom)
    layer.top.extend(v1_layer.top)
    if v1_layer.HasField("name"):
        layer.name = v1_layer.name
    layer.include.extend(v1_layer.include)
    layer.exclude.extend(v1_layer.exclude)
    if v1_layer.HasField("type"):
        enum = caffe_pb2.V1LayerParameter.LayerType
        try:
            layer.type = V1_LAYER_TYPES[enum.Name(v1_layer.type)]
        except (ValueError, KeyError):
            raise ValueError(f"{label} has unknown V1 layer type {v1_layer.type}; known: "
                             f"{', '.join(sorted(V1_LAYER_TYPES))}") from None
    layer.blobs.extend(v1_layer.blobs)
    for i, name in enumerate(v1_layer.param):
        _param_spec(layer, i).name = name
    # V1's DimCheckMode and ParamSpec's have the same numbers (STRICT = 0, PERMISSIVE = 1).
    for i, mode in enumerate(v1_layer.blob_share_mode):
        _param_spec(layer, i).share_mode = mode
    for i, lr in enumerate(v1_layer.blobs_lr):
        _param_spec(layer, i).lr_mult = lr
    for i, decay in enumerate(v1_layer.weight_decay):
        _param_spec(layer, i).decay_mult = decay
    layer.loss_weight.extend(v1_layer.loss_weight)
    for field in _V1_PARAM_FIELDS:
        if v1_layer.HasField(field):
            getattr(layer, field).CopyFrom(getattr(v1_layer, field))
    return layer


def _upgrade_v1_net(net):
    """Replace ``layers`` by upgraded ``layer`` entries (in place; UpgradeV1Net)."""
    if len(net.layer) > 0:
        # Caffe's UpgradeV1Net (src/caffe/util/upgrade_proto.cpp) stops here too, with LOG(FATAL)
        # "Refusing to upgrade inconsistent NetParameter input".
        raise ValueError(f"the net specifies both V1 'layers' ({len(net.layers)}) and new-style "
                         f"'layer' ({len(net.layer)}) entries; use one format")
    upgraded = [upgrade_v1_layer(v1, i) for i, v1 in enumerate(net.layers)]
    net.ClearField("layers")
    net.layer.extend(upgraded)


def _upgrade_input(net):
    """Turn legacy input fields into an Input layer at the front (in place; UpgradeNetInput)."""
    n = len(net.input)
    has_shape = len(net.input_shape) > 0
    has_dim = len(net.input_dim) > 0
    # An input without shape or dims is a legacy .caffemodel: dropping the field is enough.
    if has_shape or has_dim:
        # Caffe reads input_shape(i), or input_dim(4i) to input_dim(4i + 3), for each input i
        # and checks no count: too few read past the end (undefined behaviour, refused here),
        # surplus ones are never read (ignored, with a warning).
        if has_shape and len(net.input_shape) < n:
            raise ValueError(f"the net declares {n} input(s) but {len(net.input_shape)} "
                             f"input_shape(s); give exactly one input_shape per input")
        if not has_shape and len(net.input_dim) < 4 * n:
            raise ValueError(f"the net declares {n} input(s) but {len(net.input_dim)} input_dim "
                             f"values; give four per input (num, channels, height, width)")
        if has_shape and len(net.input_shape) > n:
            logger.warning("net declares %d input(s) and %d input_shape(s); the last %d are "
                           "ignored, as Caffe ignores them", n, len(net.input_shape),
                           len(net.input_shape) - n)
        if not has_shape and len(net.input_dim) > 4 * n:
            logger.warning("net declares %d input(s) and %d input_dim values; Caffe takes four "
                           "per input, the last %d (%s) are ignored", n, len(net.input_dim),
                           len(net.input_dim) - 4 * n,
                           " ".join(str(d) for d in net.input_dim[4 * n:]))
        if has_shape and has_dim:
            logger.warning("net declares both input_shape and input_dim; using input_shape, "
                           "as Caffe does")
        layer = caffe_pb2.LayerParameter(name="input", type="Input")
        for i, name in enumerate(net.input):
            layer.top.append(name)
            shape = layer.input_param.shape.add()
            if has_shape:
                shape.CopyFrom(net.input_shape[i])
            else:
                shape.dim.extend(net.input_dim[4 * i:4 * i + 4])
        # The Input layer goes first so that every consumer comes after its producer.
        rest = caffe_pb2.NetParameter()
        rest.layer.extend(net.layer)
        net.ClearField("layer")
        net.layer.append(layer)
        net.layer.extend(rest.layer)
    net.ClearField("input")
    net.ClearField("input_shape")
    net.ClearField("input_dim")


def _upgrade_batch_norm(net):
    """Freeze the three ParamSpecs of old-style BatchNorm layers (in place; UpgradeNetBatchNorm).

    BatchNorm's blobs are statistics, never trained; the old definition made users say so with three
    ``param { lr_mult: 0 }``. The layer now forces that itself, so only the multipliers are reset
    and the rest of each ParamSpec (names used for sharing) is kept.
    """
    for layer in net.layer:
        if layer.type == "BatchNorm" and len(layer.param) == 3:
            for spec in layer.param:
                spec.lr_mult = 0.0
                spec.decay_mult = 0.0


# V0LayerParameter.type string -> V1LayerParameter.LayerType name (UpgradeV0LayerType)
V0_LAYER_TYPES = {
    "accuracy": "ACCURACY", "bnll": "BNLL", "concat": "CONCAT", "conv": "CONVOLUTION",
    "data": "DATA", "dropout": "DROPOUT", "euclidean_loss": "EUCLIDEAN_LOSS",
    "flatten": "FLATTEN", "hdf5_data": "HDF5_DATA", "hdf5_output": "HDF5_OUTPUT",
    "im2col": "IM2COL", "images": "IMAGE_DATA", "infogain_loss": "INFOGAIN_LOSS",
    "innerproduct": "INNER_PRODUCT", "lrn": "LRN",
    "multinomial_logistic_loss": "MULTINOMIAL_LOGISTIC_LOSS", "pool": "POOLING", "relu": "RELU",
    "sigmoid": "SIGMOID", "softmax": "SOFTMAX", "softmax_loss": "SOFTMAX_LOSS", "split": "SPLIT",
    "tanh": "TANH", "window_data": "WINDOW_DATA",
}

# V0 field -> {V0 type: (V1 parameter message, its field)}; a repeated target field (conv's
# pad, kernel_size, stride) takes the one value.  UpgradeV0LayerParameter, field by field.
_CONV, _IP, _POOL = "convolution_param", "inner_product_param", "pooling_param"
_DATA, _HDF5, _IMAGES, _WINDOW = ("data_param", "hdf5_data_param", "image_data_param",
                                  "window_data_param")
_V0_FIELDS = {
    "num_output": {"conv": (_CONV, "num_output"), "innerproduct": (_IP, "num_output")},
    "biasterm": {"conv": (_CONV, "bias_term"), "innerproduct": (_IP, "bias_term")},
    "weight_filler": {"conv": (_CONV, "weight_filler"), "innerproduct": (_IP, "weight_filler")},
    "bias_filler": {"conv": (_CONV, "bias_filler"), "innerproduct": (_IP, "bias_filler")},
    "pad": {"conv": (_CONV, "pad"), "pool": (_POOL, "pad")},
    "kernelsize": {"conv": (_CONV, "kernel_size"), "pool": (_POOL, "kernel_size")},
    "group": {"conv": (_CONV, "group")},
    "stride": {"conv": (_CONV, "stride"), "pool": (_POOL, "stride")},
    # V0's PoolMethod and PoolingParameter's have the same numbers (MAX 0, AVE 1, STOCHASTIC 2)
    "pool": {"pool": (_POOL, "pool")},
    "dropout_ratio": {"dropout": ("dropout_param", "dropout_ratio")},
    "local_size": {"lrn": ("lrn_param", "local_size")},
    "alpha": {"lrn": ("lrn_param", "alpha")},
    "beta": {"lrn": ("lrn_param", "beta")},
    "k": {"lrn": ("lrn_param", "k")},
    "source": {"data": (_DATA, "source"), "hdf5_data": (_HDF5, "source"),
               "images": (_IMAGES, "source"), "window_data": (_WINDOW, "source"),
               "infogain_loss": ("infogain_loss_param", "source")},
    "batchsize": {"data": (_DATA, "batch_size"), "hdf5_data": (_HDF5, "batch_size"),
                  "images": (_IMAGES, "batch_size"), "window_data": (_WINDOW, "batch_size")},
    "rand_skip": {"data": (_DATA, "rand_skip"), "images": (_IMAGES, "rand_skip")},
    "shuffle_images": {"images": (_IMAGES, "shuffle")},
    "new_height": {"images": (_IMAGES, "new_height")},
    "new_width": {"images": (_IMAGES, "new_width")},
    "concat_dim": {"concat": ("concat_param", "concat_dim")},
    "det_fg_threshold": {"window_data": (_WINDOW, "fg_threshold")},
    "det_bg_threshold": {"window_data": (_WINDOW, "bg_threshold")},
    "det_fg_fraction": {"window_data": (_WINDOW, "fg_fraction")},
    "det_context_pad": {"window_data": (_WINDOW, "context_pad")},
    "det_crop_mode": {"window_data": (_WINDOW, "crop_mode")},
    "hdf5_output_param": {"hdf5_output": ("hdf5_output_param", None)},
}
# whatever the type (Caffe's transform fields of every V0 layer)
_V0_TRANSFORM = {"scale": "scale", "meanfile": "mean_file", "cropsize": "crop_size",
                 "mirror": "mirror"}


def _set(message, field, value):
    """``message.field = value`` for scalars, append for repeated, CopyFrom for messages."""
    current = getattr(message, field)
    if hasattr(current, "CopyFrom"):       # a message
        current.CopyFrom(value)
    elif hasattr(current, "append"):       # a repeated scalar (conv's pad, kernel_size, stride)
        current.append(value)
    else:
        setattr(message, field, value)


def _fold_v0_padding(net):
    """V0 ``padding`` layers, folded into the convolution or pooling that reads them
    (UpgradeV0PaddingLayers): the reader takes the padding layer's ``pad`` and its bottom."""
    last_top = {name: None for name in net.input}      # blob -> the V0 layer that wrote it last
    kept = []
    for i, conn in enumerate(net.layers):
        v0 = conn.layer
        label = f'layers {i} ("{v0.name}")' if v0.name else f"layers {i}"
        out = caffe_pb2.V1LayerParameter()
        out.CopyFrom(conn)
        for j, name in enumerate(conn.bottom):
            if name not in last_top:
                raise ValueError(f"{label}: unknown bottom blob {name!r}")
            src = last_top[name]
            if src is None or src.layer.type != "padding":
                continue
            if v0.type not in ("conv", "pool"):
                raise ValueError(f"{label}: a padding layer feeds a {v0.type!r} layer; only "
                                 "conv and pool layers take padding")
            if len(conn.bottom) != 1 or len(src.bottom) != 1 or len(src.top) != 1:
                raise ValueError(f"{label}: a padded layer, and its padding layer, take one "
                                 "bottom and give one top")
            out.layer.pad = src.layer.pad
            out.bottom[j] = src.bottom[0]
        if v0.type != "padding":
            kept.append(out)
        for name in conn.top:
            last_top[name] = conn
    return kept


def upgrade_v0_layer(conn, index=0, problems=None):
    """One V0 layer connection as a V1LayerParameter (UpgradeV0LayerParameter).

    A field that does not apply to the layer's type is dropped, with a warning; where
    ``problems`` is a list, a line naming it is appended there instead (Caffe marks the
    upgrade not fully compatible)."""
    v0 = conn.layer
    label = f'layers {index} ("{v0.name}")' if v0.name else f"layers {index}"
    v1 = caffe_pb2.V1LayerParameter()
    v1.bottom.extend(conn.bottom)
    v1.top.extend(conn.top)
    if not conn.HasField("layer"):
        return v1
    if v0.HasField("name"):
        v1.name = v0.name
    t = v0.type
    if v0.HasField("type"):
        if t not in V0_LAYER_TYPES:
            raise ValueError(f"{label} has unknown V0 layer type {t!r}; known: "
                             f"{', '.join(sorted(V0_LAYER_TYPES))}")
        v1.type = caffe_pb2.V1LayerParameter.LayerType.Value(V0_LAYER_TYPES[t])
    v1.blobs.extend(v0.blobs)
    v1.blobs_lr.extend(v0.blobs_lr)
    v1.weight_decay.extend(v0.weight_decay)
    for field, targets in _V0_FIELDS.items():
        if not v0.HasField(field):
            continue
        if t not in targets:
            if problems is None:
                logger.warning("%s: V0 field %s does not apply to a %r layer; dropped (as "
                               "Caffe drops it)", label, field, t)
            else:
                problems.append(f"{label}: V0 field {field} does not apply to a {t!r} layer; "
                                "dropped")
            continue
        msg_name, target = targets[t]
        value = getattr(v0, field)
        if target is None:
            getattr(v1, msg_name).CopyFrom(value)
        else:
            _set(getattr(v1, msg_name), target, value)
    for field, target in _V0_TRANSFORM.items():
        if v0.HasField(field):
            setattr(v1.transform_param, target, getattr(v0, field))
    return v1


# The NetParameter fields UpgradeV0Net copies back after its net_param->Clear().
_V0_NET_KEPT = ("name", "layers", "input", "input_dim", "force_backward")


def _upgrade_v0_net(net, problems=None):
    """V0 ``layers`` become V1 ``layers`` (in place; UpgradeV0Net).

    Caffe's UpgradeV0Net clears the net and copies back only the name, the layers, ``input``,
    ``input_dim`` and ``force_backward``: anything else in a V0 file (``input_shape``,
    ``state``, ``debug_info``, new-style ``layer`` entries) is dropped, here with a warning."""
    upgraded = [upgrade_v0_layer(conn, i, problems)
                for i, conn in enumerate(_fold_v0_padding(net))]
    dropped = [f.name for f, _ in net.ListFields() if f.name not in _V0_NET_KEPT]
    if dropped:
        logger.warning("V0 net: %s dropped, as Caffe's UpgradeV0Net keeps only %s",
                       ", ".join(dropped), ", ".join(_V0_NET_KEPT))
        for name in dropped:
            net.ClearField(name)
    net.ClearField("layers")
    net.layers.extend(upgraded)


def upgrade_net(net_param, problems=None):
    """Return an upgraded copy of ``net_param`` in the current format (UpgradeNetAsNeeded).

    Raises ValueError for V1 nets that mix ``layer`` and ``layers``, for unknown V0 or V1 layer
    types, for padding layers Caffe cannot fold and for inconsistent legacy input declarations.
    Where Caffe instead logs an error and goes on (a V0 field that does not apply to its
    layer's type is dropped), a warning is logged, or, when the list ``problems`` is given, a
    line is appended to it: Caffe's UpgradeNetAsNeeded then returns false, and its upgrade
    tools exit with status 1.
    """
    net = caffe_pb2.NetParameter()
    net.CopyFrom(net_param)
    if net_needs_v0_upgrade(net):
        logger.warning("upgrading a net in the deprecated V0 format (layers { layer { ... } }); "
                       "python -m minicaffe.tools.upgrade_net_proto_text writes it in the "
                       "current one")
        _upgrade_v0_net(net, problems)
    if net_needs_data_upgrade(net):
        logger.info("upgrading deprecated data transformation fields into transform_param")
        _upgrade_data_transformation(net)
    if net_needs_v1_upgrade(net):
        logger.info("upgrading deprecated V1LayerParameter 'layers' into 'layer'")
        _upgrade_v1_net(net)
    if net_needs_input_upgrade(net):
        logger.info("upgrading deprecated input fields into an Input layer")
        _upgrade_input(net)
    if net_needs_batch_norm_upgrade(net):
        logger.info("upgrading old-style BatchNorm param specs (lr_mult = decay_mult = 0)")
        _upgrade_batch_norm(net)
    return net


def solver_needs_upgrade(solver_param):
    """True iff the solver uses the deprecated ``solver_type`` enum (SolverNeedsTypeUpgrade)."""
    return solver_param.HasField("solver_type")


def upgrade_solver(solver_param):
    """Return a copy of ``solver_param`` with ``solver_type`` turned into ``type``.

    Caffe's UpgradeSolverType.

    Raises ValueError when both fields are given, as Caffe does.
    """
    solver = caffe_pb2.SolverParameter()
    solver.CopyFrom(solver_param)
    if not solver_needs_upgrade(solver):
        return solver
    if solver.HasField("type"):
        raise ValueError("the solver specifies both the deprecated 'solver_type' (enum) and 'type' "
                         "(string); keep only 'type'")
    name = _SOLVER_TYPES.get(solver.solver_type)
    if name is None:
        raise ValueError(f"unknown solver_type {solver.solver_type}; known: "
                         f"{', '.join(caffe_pb2.SolverParameter.SolverType.keys())}")
    logger.info("upgrading deprecated solver_type %s into type: %r",
                caffe_pb2.SolverParameter.SolverType.Name(solver.solver_type), name)
    solver.type = name
    solver.ClearField("solver_type")
    return solver
