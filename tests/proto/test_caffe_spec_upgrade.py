"""Net and solver upgrades checked against BVLC Caffe's src/caffe/test/test_upgrade_proto.cpp.

NetUpgradeTest.TestImageNet upgrades Caffe's V0 CaffeNet to V1 and that V1 net to V2, with the
exact expected output of each step; minicaffe upgrades V0 straight to V2, so both the V0 and
the V1 input must give Caffe's expected V2 net.  TestUpgradeV1LayerType creates a layer of
every V1 type; SolverTypeUpgradeTest turns each ``solver_type`` enum into the ``type`` string.
"""
import pytest

from minicaffe.layer import create_layer
from minicaffe.proto import caffe_pb2, parse_text, upgrade_net, upgrade_solver
from minicaffe.proto.upgrade import V1_LAYER_TYPES


def P(text, message=caffe_pb2.NetParameter):
    return parse_text(text, message, filename="<caffe upgrade test>")


def _v0_conv(name, bottom, num, k, bias, group="", stride=""):
    return f"""layers {{ layer {{ name: '{name}' type: 'conv' num_output: {num} {group}
        kernelsize: {k} {stride} weight_filler {{ type: 'gaussian' std: 0.01 }}
        bias_filler {{ type: 'constant' value: {bias} }}
        blobs_lr: 1. blobs_lr: 2. weight_decay: 1. weight_decay: 0. }}
      bottom: '{bottom}' top: '{name}' }} """


def _v0(name, kind, bottom, top, extra=""):
    return (f"layers {{ layer {{ name: '{name}' type: '{kind}' {extra} }} "
            f"bottom: '{bottom}' top: '{top}' }} ")


def _v0_ip(name, bottom, num, std, bias):
    return f"""layers {{ layer {{ name: '{name}' type: 'innerproduct' num_output: {num}
        weight_filler {{ type: 'gaussian' std: {std} }}
        bias_filler {{ type: 'constant' value: {bias} }}
        blobs_lr: 1. blobs_lr: 2. weight_decay: 1. weight_decay: 0. }}
      bottom: '{bottom}' top: '{name}' }} """


# Caffe's v0_proto of NetUpgradeTest.TestImageNet, written with helpers for its repeated parts.
V0_IMAGENET = (
    "name: 'CaffeNet' "
    "layers { layer { name: 'data' type: 'data' "
    "  source: '/home/jiayq/Data/ILSVRC12/train-leveldb' "
    "  meanfile: '/home/jiayq/Data/ILSVRC12/image_mean.binaryproto' "
    "  batchsize: 256 cropsize: 227 mirror: true } top: 'data' top: 'label' } "
    + _v0_conv("conv1", "data", 96, 11, "0.", stride="stride: 4")
    + _v0("relu1", "relu", "conv1", "conv1")
    + _v0("pool1", "pool", "conv1", "pool1", "pool: MAX kernelsize: 3 stride: 2")
    + _v0("norm1", "lrn", "pool1", "norm1", "local_size: 5 alpha: 0.0001 beta: 0.75")
    + _v0("pad2", "padding", "norm1", "pad2", "pad: 2")
    + _v0_conv("conv2", "pad2", 256, 5, "1.", group="group: 2")
    + _v0("relu2", "relu", "conv2", "conv2")
    + _v0("pool2", "pool", "conv2", "pool2", "pool: MAX kernelsize: 3 stride: 2")
    + _v0("norm2", "lrn", "pool2", "norm2", "local_size: 5 alpha: 0.0001 beta: 0.75")
    + _v0("pad3", "padding", "norm2", "pad3", "pad: 1")
    + _v0_conv("conv3", "pad3", 384, 3, "0.")
    + _v0("relu3", "relu", "conv3", "conv3")
    + _v0("pad4", "padding", "conv3", "pad4", "pad: 1")
    + _v0_conv("conv4", "pad4", 384, 3, "1.", group="group: 2")
    + _v0("relu4", "relu", "conv4", "conv4")
    + _v0("pad5", "padding", "conv4", "pad5", "pad: 1")
    + _v0_conv("conv5", "pad5", 256, 3, "1.", group="group: 2")
    + _v0("relu5", "relu", "conv5", "conv5")
    + _v0("pool5", "pool", "conv5", "pool5", "kernelsize: 3 pool: MAX stride: 2")
    + _v0_ip("fc6", "pool5", 4096, 0.005, "1.")
    + _v0("relu6", "relu", "fc6", "fc6")
    + _v0("drop6", "dropout", "fc6", "fc6", "dropout_ratio: 0.5")
    + _v0_ip("fc7", "fc6", 4096, 0.005, "1.")
    + _v0("relu7", "relu", "fc7", "fc7")
    + _v0("drop7", "dropout", "fc7", "fc7", "dropout_ratio: 0.5")
    + _v0_ip("fc8", "fc7", 1000, 0.01, "0")
    + "layers { layer { name: 'loss' type: 'softmax_loss' } bottom: 'fc8' bottom: 'label' } "
)

LR = "blobs_lr: 1. blobs_lr: 2. weight_decay: 1. weight_decay: 0."
PARAMS = "param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }"


def _conv(v1, name, bottom, num, k, bias, group="", pad="", stride=""):
    head = f"name: '{name}' type: " + ("CONVOLUTION" if v1 else "'Convolution'")
    return (f"{'layers' if v1 else 'layer'} {{ {head} convolution_param {{ num_output: {num} "
            f"{group} kernel_size: {k} {stride} {pad} "
            f"weight_filler {{ type: 'gaussian' std: 0.01 }} "
            f"bias_filler {{ type: 'constant' value: {bias} }} }} {LR if v1 else PARAMS} "
            f"bottom: '{bottom}' top: '{name}' }} ")


def _ip(v1, name, bottom, num, std, bias):
    head = f"name: '{name}' type: " + ("INNER_PRODUCT" if v1 else "'InnerProduct'")
    return (f"{'layers' if v1 else 'layer'} {{ {head} inner_product_param {{ num_output: {num} "
            f"weight_filler {{ type: 'gaussian' std: {std} }} "
            f"bias_filler {{ type: 'constant' value: {bias} }} }} {LR if v1 else PARAMS} "
            f"bottom: '{bottom}' top: '{name}' }} ")


def _simple(v1, name, v1_type, v2_type, bottom, top, extra=""):
    kind = v1_type if v1 else f"'{v2_type}'"
    return (f"{'layers' if v1 else 'layer'} {{ name: '{name}' type: {kind} {extra} "
            f"bottom: '{bottom}' top: '{top}' }} ")


def imagenet(v1):
    """Caffe's expected_v1_proto (v1=True) or expected_v2_proto (v1=False) of TestImageNet."""
    pool = "pooling_param { pool: MAX kernel_size: 3 stride: 2 } "
    lrn = "lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 } "
    drop = "dropout_param { dropout_ratio: 0.5 } "
    s = lambda *a: _simple(v1, *a)  # noqa: E731
    return (
        "name: 'CaffeNet' "
        + ("layers { name: 'data' type: DATA " if v1 else
           "layer { name: 'data' type: 'Data' ")
        + "data_param { source: '/home/jiayq/Data/ILSVRC12/train-leveldb' batch_size: 256 } "
          "transform_param { crop_size: 227 mirror: true "
          "mean_file: '/home/jiayq/Data/ILSVRC12/image_mean.binaryproto' } "
          "top: 'data' top: 'label' } "
        + _conv(v1, "conv1", "data", 96, 11, "0.", stride="stride: 4")
        + s("relu1", "RELU", "ReLU", "conv1", "conv1")
        + s("pool1", "POOLING", "Pooling", "conv1", "pool1", pool)
        + s("norm1", "LRN", "LRN", "pool1", "norm1", lrn)
        + _conv(v1, "conv2", "norm1", 256, 5, "1.", group="group: 2", pad="pad: 2")
        + s("relu2", "RELU", "ReLU", "conv2", "conv2")
        + s("pool2", "POOLING", "Pooling", "conv2", "pool2", pool)
        + s("norm2", "LRN", "LRN", "pool2", "norm2", lrn)
        + _conv(v1, "conv3", "norm2", 384, 3, "0.", pad="pad: 1")
        + s("relu3", "RELU", "ReLU", "conv3", "conv3")
        + _conv(v1, "conv4", "conv3", 384, 3, "1.", group="group: 2", pad="pad: 1")
        + s("relu4", "RELU", "ReLU", "conv4", "conv4")
        + _conv(v1, "conv5", "conv4", 256, 3, "1.", group="group: 2", pad="pad: 1")
        + s("relu5", "RELU", "ReLU", "conv5", "conv5")
        + s("pool5", "POOLING", "Pooling", "conv5", "pool5",
            "pooling_param { kernel_size: 3 pool: MAX stride: 2 } ")
        + _ip(v1, "fc6", "pool5", 4096, 0.005, "1.")
        + s("relu6", "RELU", "ReLU", "fc6", "fc6")
        + s("drop6", "DROPOUT", "Dropout", "fc6", "fc6", drop)
        + _ip(v1, "fc7", "fc6", 4096, 0.005, "1.")
        + s("relu7", "RELU", "ReLU", "fc7", "fc7")
        + s("drop7", "DROPOUT", "Dropout", "fc7", "fc7", drop)
        + _ip(v1, "fc8", "fc7", 1000, 0.01, "0")
        + ("layers { name: 'loss' type: SOFTMAX_LOSS " if v1 else
           "layer { name: 'loss' type: 'SoftmaxWithLoss' ")
        + "bottom: 'fc8' bottom: 'label' } ")


@pytest.mark.parametrize("given", ["v0", "v1"])
def test_imagenet_upgrades_to_caffes_v2_net(given):
    """TestImageNet: padding layers folded into the convolutions, flat V0 fields moved to
    their parameter messages, the data layer's transformation into transform_param, V1 enum
    types to strings, blobs_lr/weight_decay to param { lr_mult decay_mult }."""
    net = P(V0_IMAGENET if given == "v0" else imagenet(v1=True))
    expected = P(imagenet(v1=False))
    out = upgrade_net(net)
    assert out == expected
    assert upgrade_net(out) == out   # nothing left to upgrade


def test_every_v1_layer_type_upgrades_to_a_creatable_layer():
    """TestUpgradeV1LayerType: every V1LayerParameter.LayerType upgrades to a type string
    (NONE to the empty string) for which a layer can be created."""
    enum = caffe_pb2.V1LayerParameter.LayerType
    assert sorted(V1_LAYER_TYPES) == sorted(enum.keys())
    for v1_name in enum.keys():
        v2_type = V1_LAYER_TYPES[v1_name]
        if v2_type == "":
            assert v1_name == "NONE"
            continue
        up = upgrade_net(P(f"layers {{ name: 'x' type: {v1_name} }}"))
        assert up.layer[0].type == v2_type
        layer = create_layer(caffe_pb2.LayerParameter(name="x", type=v2_type))
        assert layer.type == v2_type


SOLVER = ("net: 'examples/mnist/lenet_train_test.prototxt' test_iter: 100 test_interval: 500 "
          "base_lr: 0.01 momentum: 0.0 weight_decay: 0.0005 lr_policy: 'inv' gamma: 0.0001 "
          "power: 0.75 display: 100 max_iter: 10000 snapshot: 5000 "
          "snapshot_prefix: 'examples/mnist/lenet_rmsprop' solver_mode: GPU ")


@pytest.mark.parametrize("old, new", [("SGD", "SGD"), ("ADAGRAD", "AdaGrad"),
                                      ("NESTEROV", "Nesterov"), ("RMSPROP", "RMSProp"),
                                      ("ADADELTA", "AdaDelta"), ("ADAM", "Adam")])
def test_solver_type_upgrade(old, new):
    """SolverTypeUpgradeTest.TestSimple: solver_type is replaced by the type string; every
    other field stays as it was."""
    given = P(SOLVER + f"solver_type: {old}", caffe_pb2.SolverParameter)
    expected = P(SOLVER + f"type: '{new}'", caffe_pb2.SolverParameter)
    assert upgrade_solver(given) == expected
