"""Caffe's upgrade of deprecated net and solver definitions (src/caffe/util/upgrade_proto.cpp).

Caffe reads old files by rewriting them into the current schema right after parsing, and minicaffe
does the same, in Caffe's order:

1. V0 nets (``layers { layer { ... } }``, 2013) are refused with a pointer to Caffe's converter:
   no published model still needs them and the padding-layer folding they require is easy to get
   subtly wrong.
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
        raise ValueError(f"{label} holds a V0 layer definition; upgrade the file with Caffe's "
                         f"upgrade_net_proto_text first")
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
        # Caffe ignores the `layer` entries here, with an error in its log; a net that mixes the two
        # formats is almost certainly a mistake, so refuse it outright.
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
        if has_shape and len(net.input_shape) != n:
            raise ValueError(f"the net declares {n} input(s) but {len(net.input_shape)} "
                             f"input_shape(s); give exactly one input_shape per input")
        if not has_shape and len(net.input_dim) != 4 * n:
            raise ValueError(f"the net declares {n} input(s) but {len(net.input_dim)} input_dim "
                             f"values; give four per input (num, channels, height, width)")
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


def upgrade_net(net_param):
    """Return an upgraded copy of ``net_param`` in the current format (UpgradeNetAsNeeded).

    Raises ValueError for V0 nets, for nets that mix ``layer`` and ``layers``, for unknown V1 layer
    types and for inconsistent legacy input declarations.
    """
    net = caffe_pb2.NetParameter()
    net.CopyFrom(net_param)
    if net_needs_v0_upgrade(net):
        raise ValueError("the net uses the V0 layer format (layers { layer { ... } }), which "
                         "minicaffe does not upgrade; convert it with Caffe's "
                         "upgrade_net_proto_text first")
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
