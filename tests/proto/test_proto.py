"""minicaffe.proto: schema fidelity to BVLC Caffe, prototxt and binary I/O, legacy upgrades."""

import importlib.util
import os
import pickle
import textwrap

import pytest

from minicaffe.proto import (BinaryProtoError, PrototxtError, caffe_pb2, parse_text, read_binary,
                             read_net_param, read_solver_param, upgrade_net, upgrade_solver,
                             write_binary, write_text)
from minicaffe.proto.text import layer_blocks, layer_line

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Field numbers from /work/shared/CAFFE_FACTS.md (checked against upstream BVLC Caffe).
CAFFE_FIELD_NUMBERS = {
    "BlobShape": dict(dim=1),
    "BlobProto": dict(shape=7, data=5, diff=6, double_data=8, double_diff=9, num=1, channels=2,
                      height=3, width=4),
    "NetParameter": dict(name=1, input=3, input_shape=8, input_dim=4, force_backward=5, state=6,
                         debug_info=7, layer=100, layers=2),
    "LayerParameter": dict(
        name=1, type=2, bottom=3, top=4, phase=10, loss_weight=5, param=6, blobs=7,
        propagate_down=11, include=8, exclude=9, transform_param=100, loss_param=101,
        accuracy_param=102, concat_param=104, convolution_param=106, data_param=107,
        dropout_param=108, dummy_data_param=109, eltwise_param=110, hdf5_data_param=112,
        inner_product_param=117, lrn_param=118, memory_data_param=119, pooling_param=121,
        relu_param=123, softmax_param=125, reshape_param=133, flatten_param=135,
        batch_norm_param=139, bias_param=141, scale_param=142, input_param=143,
        tanh_param=127, sigmoid_param=124, slice_param=126),
    "ParamSpec": dict(name=1, share_mode=2, lr_mult=3, decay_mult=4),
    "NetStateRule": dict(phase=1, min_level=2, max_level=3, stage=4, not_stage=5),
    "NetState": dict(phase=1, level=2, stage=3),
    "FillerParameter": dict(type=1, value=2, min=3, max=4, mean=5, std=6, sparse=7,
                            variance_norm=8),
    "ConvolutionParameter": dict(num_output=1, bias_term=2, pad=3, kernel_size=4, stride=6,
                                 dilation=18, pad_h=9, pad_w=10, kernel_h=11, kernel_w=12,
                                 stride_h=13, stride_w=14, group=5, weight_filler=7,
                                 bias_filler=8, engine=15, axis=16, force_nd_im2col=17),
    "PoolingParameter": dict(pool=1, pad=4, pad_h=9, pad_w=10, kernel_size=2, kernel_h=5,
                             kernel_w=6, stride=3, stride_h=7, stride_w=8, engine=11,
                             global_pooling=12, round_mode=13),
    "InnerProductParameter": dict(num_output=1, bias_term=2, weight_filler=3, bias_filler=4,
                                  axis=5, transpose=6),
    "LRNParameter": dict(local_size=1, alpha=2, beta=3, norm_region=4, k=5, engine=6),
    "BatchNormParameter": dict(use_global_stats=1, moving_average_fraction=2, eps=3),
    "ScaleParameter": dict(axis=1, num_axes=2, filler=3, bias_term=4, bias_filler=5),
    "BiasParameter": dict(axis=1, num_axes=2, filler=3),
    "DropoutParameter": dict(dropout_ratio=1),
    "ConcatParameter": dict(axis=2, concat_dim=1),
    "EltwiseParameter": dict(operation=1, coeff=2, stable_prod_grad=3),
    "SoftmaxParameter": dict(engine=1, axis=2),
    "AccuracyParameter": dict(top_k=1, axis=2, ignore_label=3),
    "LossParameter": dict(ignore_label=1, normalization=3, normalize=2),
    "ReLUParameter": dict(negative_slope=1, engine=2),
    "FlattenParameter": dict(axis=1, end_axis=2),
    "ReshapeParameter": dict(shape=1, axis=2, num_axes=3),
    "DataParameter": dict(source=1, batch_size=4, rand_skip=7, backend=8, scale=2, mean_file=3,
                          crop_size=5, mirror=6, force_encoded_color=9, prefetch=10),
    "DummyDataParameter": dict(data_filler=1, shape=6, num=2, channels=3, height=4, width=5),
    "InputParameter": dict(shape=1),
    "HDF5DataParameter": dict(source=1, batch_size=2, shuffle=3),
    "MemoryDataParameter": dict(batch_size=1, channels=2, height=3, width=4),
    "TransformationParameter": dict(scale=1, mirror=2, crop_size=3, mean_file=4, mean_value=5,
                                    force_color=6, force_gray=7),
    "Datum": dict(channels=1, height=2, width=3, data=4, label=5, float_data=6, encoded=7),
    "SolverParameter": dict(
        net=24, net_param=25, train_net=1, test_net=2, train_state=26, test_state=27,
        test_iter=3, test_interval=4, test_compute_loss=19, test_initialization=32, base_lr=5,
        display=6, average_loss=33, max_iter=7, iter_size=36, lr_policy=8, gamma=9, power=10,
        momentum=11, weight_decay=12, regularization_type=29, stepsize=13, stepvalue=34,
        clip_gradients=35, snapshot=14, snapshot_prefix=15, snapshot_diff=16,
        snapshot_format=37, solver_mode=17, device_id=18, random_seed=20, type=40, delta=31,
        momentum2=39, rms_decay=38, debug_info=23, snapshot_after_train=28, solver_type=30,
        layer_wise_reduce=41, weights=42),
    "SolverState": dict(iter=1, learned_net=2, history=3, current_step=4),
    "V1LayerParameter": dict(
        bottom=2, top=3, name=4, include=32, exclude=33, type=5, blobs=6, param=1001,
        blobs_lr=7, weight_decay=8, loss_weight=35, convolution_param=10, pooling_param=19,
        inner_product_param=17, lrn_param=18, dropout_param=12, relu_param=30, concat_param=9,
        eltwise_param=24, softmax_param=39, accuracy_param=27, data_param=11,
        transform_param=36, loss_param=42),
}

CAFFE_ENUM_VALUES = {
    ("Phase", None): dict(TRAIN=0, TEST=1),
    ("FillerParameter", "VarianceNorm"): dict(FAN_IN=0, FAN_OUT=1, AVERAGE=2),
    ("ConvolutionParameter", "Engine"): dict(DEFAULT=0, CAFFE=1, CUDNN=2),
    ("PoolingParameter", "PoolMethod"): dict(MAX=0, AVE=1, STOCHASTIC=2),
    ("PoolingParameter", "RoundMode"): dict(CEIL=0, FLOOR=1),
    ("LRNParameter", "NormRegion"): dict(ACROSS_CHANNELS=0, WITHIN_CHANNEL=1),
    ("EltwiseParameter", "EltwiseOp"): dict(PROD=0, SUM=1, MAX=2),
    ("LossParameter", "NormalizationMode"): dict(FULL=0, VALID=1, BATCH_SIZE=2, NONE=3),
    ("DataParameter", "DB"): dict(LEVELDB=0, LMDB=1),
    ("SolverParameter", "SolverMode"): dict(CPU=0, GPU=1),
    ("V1LayerParameter", "LayerType"): dict(CONVOLUTION=4, POOLING=17, RELU=18, INNER_PRODUCT=14,
                                            LRN=15, DROPOUT=6, SOFTMAX_LOSS=21, SPLIT=22),
}


@pytest.mark.parametrize("message_name", sorted(CAFFE_FIELD_NUMBERS))
def test_field_numbers_match_caffe(message_name):
    fields = caffe_pb2.DESCRIPTOR.message_types_by_name[message_name].fields_by_name
    actual = {name: fields[name].number for name in CAFFE_FIELD_NUMBERS[message_name]
              if name in fields}
    assert actual == CAFFE_FIELD_NUMBERS[message_name]


@pytest.mark.parametrize("owner,enum_name", sorted(CAFFE_ENUM_VALUES, key=str))
def test_enum_values_match_caffe(owner, enum_name):
    if enum_name is None:
        enum = caffe_pb2.DESCRIPTOR.enum_types_by_name[owner]
    else:
        enum = caffe_pb2.DESCRIPTOR.message_types_by_name[owner].enum_types_by_name[enum_name]
    values = {v.name: v.number for v in enum.values}
    expected = CAFFE_ENUM_VALUES[(owner, enum_name)]
    assert {k: values.get(k) for k in expected} == expected


def test_defaults_match_caffe():
    assert caffe_pb2.ParamSpec().lr_mult == 1 and caffe_pb2.ParamSpec().decay_mult == 1
    assert caffe_pb2.NetState().phase == caffe_pb2.TEST
    assert caffe_pb2.FillerParameter().type == "constant"
    assert caffe_pb2.FillerParameter().std == 1 and caffe_pb2.FillerParameter().sparse == -1
    conv = caffe_pb2.ConvolutionParameter()
    assert conv.bias_term and conv.group == 1 and conv.axis == 1
    pool = caffe_pb2.PoolingParameter()
    assert pool.stride == 1 and pool.round_mode == caffe_pb2.PoolingParameter.CEIL
    lrn = caffe_pb2.LRNParameter()
    assert (lrn.local_size, lrn.alpha, lrn.beta, lrn.k) == (5, 1, 0.75, 1)
    bn = caffe_pb2.BatchNormParameter()
    assert bn.moving_average_fraction == pytest.approx(0.999)
    assert bn.eps == pytest.approx(1e-5)
    assert caffe_pb2.DropoutParameter().dropout_ratio == 0.5
    assert caffe_pb2.ConcatParameter().axis == 1
    assert caffe_pb2.EltwiseParameter().operation == caffe_pb2.EltwiseParameter.SUM
    assert caffe_pb2.AccuracyParameter().top_k == 1
    assert caffe_pb2.LossParameter().normalization == caffe_pb2.LossParameter.VALID
    assert caffe_pb2.FlattenParameter().end_axis == -1
    assert caffe_pb2.ReshapeParameter().num_axes == -1
    assert caffe_pb2.DataParameter().prefetch == 4
    solver = caffe_pb2.SolverParameter()
    assert solver.type == "SGD" and solver.solver_mode == caffe_pb2.SolverParameter.GPU
    assert solver.random_seed == -1 and solver.test_initialization
    assert solver.average_loss == 1 and solver.iter_size == 1


def test_module_looks_like_generated_caffe_pb2():
    assert caffe_pb2.TRAIN == 0 and caffe_pb2.TEST == 1
    assert caffe_pb2.Phase.Name(caffe_pb2.TEST) == "TEST"
    assert caffe_pb2.PoolingParameter.MAX == 0
    assert caffe_pb2.PoolingParameter.PoolMethod.Value("AVE") == 1
    assert caffe_pb2.V1LayerParameter.CONVOLUTION == 4
    assert caffe_pb2.DESCRIPTOR.package == "caffe"
    net = caffe_pb2.NetParameter(name="n")
    assert pickle.loads(pickle.dumps(net)) == net


def _load_gen_proto():
    spec = importlib.util.spec_from_file_location(
        "gen_proto", os.path.join(REPO, "scripts", "gen_proto.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_descriptor_matches_proto():
    pytest.importorskip("grpc_tools.protoc")
    from google.protobuf import descriptor_pb2

    gen_proto = _load_gen_proto()
    fresh = gen_proto.generate_descriptor_set()
    with open(gen_proto.DESCRIPTOR_PATH, "rb") as f:
        checked_in = f.read()
    if fresh != checked_in:
        # Another protoc may serialise the same schema differently; only a schema change matters.
        assert (descriptor_pb2.FileDescriptorSet.FromString(fresh)
                == descriptor_pb2.FileDescriptorSet.FromString(checked_in)), \
            "caffe_descriptor.bin is stale: run python scripts/gen_proto.py"


NEW_STYLE_NET = """\
name: "tiny"
force_backward: true
layer {
  name: "data"
  type: "Input"
  top: "data"
  input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } }
}
layer {
  name: "conv1"
  type: "Convolution"
  bottom: "data"
  top: "conv1"
  param { lr_mult: 1 decay_mult: 1 }
  param { lr_mult: 2 decay_mult: 0 }
  convolution_param {
    num_output: 4
    kernel_size: 3
    pad: 1
    stride: 1
    weight_filler { type: "msra" }
    bias_filler { type: "constant" value: 0.1 }
    engine: CAFFE
  }
}
layer {
  name: "bn1"
  type: "BatchNorm"
  bottom: "conv1"
  top: "conv1"
  batch_norm_param { use_global_stats: false moving_average_fraction: 0.9 }
}
layer {
  name: "pool1"
  type: "Pooling"
  bottom: "conv1"
  top: "pool1"
  pooling_param { pool: AVE kernel_size: 2 stride: 2 round_mode: FLOOR }
}
layer {
  name: "acc"
  type: "Accuracy"
  bottom: "pool1"
  bottom: "label"
  top: "acc"
  include { phase: TEST stage: "val" }
  accuracy_param { top_k: 5 }
}
layer {
  name: "loss"
  type: "SoftmaxWithLoss"
  bottom: "pool1"
  bottom: "label"
  top: "loss"
  loss_weight: 1
  loss_param { normalization: BATCH_SIZE ignore_label: 255 }
}
"""


def test_text_round_trip(tmp_path):
    net = parse_text(NEW_STYLE_NET, caffe_pb2.NetParameter)
    assert [l.type for l in net.layer] == ["Input", "Convolution", "BatchNorm", "Pooling",
                                           "Accuracy", "SoftmaxWithLoss"]
    assert net.layer[3].pooling_param.pool == caffe_pb2.PoolingParameter.AVE
    assert net.layer[4].include[0].phase == caffe_pb2.TEST
    path = tmp_path / "net.prototxt"
    write_text(net, path)
    again = read_net_param(path)
    assert again == net
    write_text(again, path)  # overwrite in place
    assert read_net_param(path) == net
    assert os.listdir(tmp_path) == ["net.prototxt"]  # no temporary file left behind


def test_parse_error_names_file_line_and_column(tmp_path):
    path = tmp_path / "bad.prototxt"
    path.write_text('name: "x"\nlayer {\n  name: "c"\n  type: "Convolution"\n  bottom: data\n}\n')
    with pytest.raises(PrototxtError) as info:
        read_net_param(path)
    err = info.value
    assert isinstance(err, ValueError)
    assert str(err).startswith(f"{path}:5:11: ")
    assert (err.filename, err.line, err.column) == (str(path), 5, 11)
    assert "quoted" in str(err)


@pytest.mark.parametrize("text,needle", [
    ('layer { name: "a" blobs_lr: 1 }', "lr_mult"),
    ('layer { type: CONVOLUTION }', 'type: "Convolution"'),
    ('layers { type: "Convolution" }', "type: CONVOLUTION"),
    ('layers {\n  param {\n    lr_mult: 1\n  }\n}', "blobs_lr"),
    ('layer { num_output: 3 }', "convolution_param"),
    ('layer { nmae: "x" }', '"name"'),
    ('layer { pooling_param { pool: max } }', "MAX, AVE, STOCHASTIC"),
])
def test_parse_error_hints(text, needle):
    with pytest.raises(PrototxtError) as info:
        parse_text(text, caffe_pb2.NetParameter, filename="net.prototxt")
    assert str(info.value).startswith("net.prototxt:")
    assert needle in str(info.value)



@pytest.mark.parametrize("cls, text, needle", [
    # PSPNet / DeepLab forks
    (caffe_pb2.NetParameter, 'layer { name: "p" type: "Pooling" pooling_param { ceil_mode: false } }',
     "round_mode: FLOOR"),
    (caffe_pb2.NetParameter, 'layer { name: "c" type: "Convolution" convolution_param { hole: 2 } }',
     "dilation"),
    # py-faster-rcnn models/pascal_voc/ZF/faster_rcnn_end2end/test.prototxt
    (caffe_pb2.NetParameter, 'layer { name: "d" type: "Dropout" dropout_param { scale_train: false } }',
     "cannot express"),
    # chuanqi305/MobileNet-SSD solver_train.prototxt
    (caffe_pb2.SolverParameter, 'base_lr: 0.0005\neval_type: "detection"\nap_version: "11point"\n',
     "SSD's Caffe fork"),
])
def test_parse_errors_on_fork_fields_say_what_bvlc_caffe_has(cls, text, needle):
    """Fields that Caffe forks added to BVLC's messages fail to parse, as in Caffe; the hint
    names the fork and BVLC's equivalent rather than a near spelling (SSD's eval_type was
    answered 'did you mean "type" or "solver_type"?')."""
    with pytest.raises(PrototxtError) as info:
        parse_text(text, cls, filename="f.prototxt")
    msg = str(info.value)
    assert msg.startswith("f.prototxt:") and "has no field named" in msg
    assert needle in msg and "did you mean" not in msg

def test_unknown_param_of_a_fork_layer_names_the_layer_type(tmp_path):
    """A fork's layer carries a parameter block BVLC's schema lacks: the parse error (at that
    field, as Caffe's) says that the layer type is no BVLC type, instead of guessing a typo."""
    path = tmp_path / "fork.prototxt"
    path.write_text(
        'name: "fork"\n'
        'layer { name: "data" type: "Input" top: "data"\n'
        '        input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }\n'
        'layer {\n'
        '  name: "rescale"\n'
        '  type: "ChannelRescale"   # a fork\'s layer\n'
        '  bottom: "data"\n'
        '  top: "rescale"\n'
        '  channel_rescale_param { factor: 2 }\n'
        '}\n')
    with pytest.raises(PrototxtError) as info:
        read_net_param(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:9:3: ")
    assert "layer 'rescale' (line 4)" in msg and '"ChannelRescale"' in msg
    assert "no BVLC Caffe layer type" in msg and "did you mean" not in msg
    # a misspelt field of a BVLC layer keeps the spelling hint
    path.write_text('layer { name: "c" type: "Convolution" convolution_parm { } }')
    with pytest.raises(PrototxtError, match='did you mean "convolution_param"'):
        read_net_param(path)


def test_unknown_field_inside_a_layer_names_that_layer(tmp_path):
    """The parser places an unknown field at the field; in a long net (soeaver's ResNet-18
    deploy has its fork field ``ceil_mode`` in pool1's pooling_param, line 129) the error
    also names the layer block it is in, with that block's line and type."""
    path = tmp_path / "net.prototxt"
    path.write_text(
        'input: "data"\n'
        'layer {\n'
        '  bottom: "data"\n'
        '  top: "pool1"\n'
        '  name: "pool1"\n'
        '  type: "Pooling"\n'
        '  pooling_param {\n'
        '    kernel_size: 3\n'
        '    ceil_mode: false\n'
        '  }\n'
        '}\n')
    with pytest.raises(PrototxtError) as info:
        read_net_param(path)
    msg = str(info.value)
    assert msg.startswith(f'{path}:9:5: Message type "caffe.PoolingParameter" has no field '
                          '''named "ceil_mode" in layer 'pool1' (line 2) of type "Pooling".''')
    assert "round_mode: FLOOR" in msg                       # the fork hint stays
    # a misspelt field of the layer itself: the layer named, the spelling hint kept
    path.write_text('layer { name: "r" type: "ReLU"\n  relu_parm { } }\n')
    with pytest.raises(PrototxtError, match=r'''named "relu_parm" in layer 'r' \(line 1\) of '''
                       r'type "ReLU"\. \(hint: did you mean "relu_param"'):
        read_net_param(path)
    # outside any layer block nothing is added
    path.write_text('nmae: "n"\n')
    with pytest.raises(PrototxtError, match=r'no field named "nmae"\. \(hint'):
        read_net_param(path)


def test_unknown_enum_value_names_its_layer(tmp_path):
    """An enum value that caffe.proto lacks fails to parse at the value, as in Caffe; the
    message also names the layer block it sits in, as for an unknown field.  A V1 ``type``
    that is spelt as an enum but is none of BVLC's (a fork's, DeepLab v1's INTERP here) is
    said to be a fork's layer, not a slip between ``layer`` and ``layers`` syntax."""
    path = tmp_path / "net.prototxt"
    path.write_text('input: "data"\nlayers {\n  bottom: "data"\n  top: "up"\n  name: "up"\n'
                    '  type: INTERP\n}\n')
    with pytest.raises(PrototxtError) as e:
        read_net_param(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:6:9: ") and "has no value named INTERP in layer 'up' (line 2)" in msg
    assert "INTERP is no V1 layer type of BVLC Caffe" in msg and "quoted type string" not in msg
    # a new-style type string in a V1 block keeps its hint
    path.write_text('layers {\n  name: "c"\n  type: "Convolution"\n}\n')
    with pytest.raises(PrototxtError, match=r"in layer 'c' \(line 1\).*type: CONVOLUTION"):
        read_net_param(path)
    # an enum field inside a layer's parameters: the layer named, the valid values listed
    path.write_text('layer {\n  name: "pool1"\n  type: "Pooling"\n  pooling_param {\n'
                    '    pool: MAXIMUM\n  }\n}\n')
    with pytest.raises(PrototxtError) as e:
        read_net_param(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:5:11: ")
    assert "in layer 'pool1' (line 1) of type \"Pooling\"" in msg and "MAX, AVE, STOCHASTIC" in msg


def test_layer_blocks_give_lines_names_and_types():
    text = textwrap.dedent("""\
        name: 'n'   # layer { name: "in a comment" }
        input_shape: { dim: 1 }
        layer { name: 'a' type: "ReLU" bottom: "x" top: "y" }
        layer {
          name: "b}{"
          convolution_param { type: "not the layer's" }
          type: 'Convolution'
        }
        layers: { name: "v1" type: RELU }
        """)
    blocks = layer_blocks(text)
    assert [(b["line"], b["end"], b["name"], b["type"]) for b in blocks] == [
        (3, 3, "a", "ReLU"), (4, 8, "b}{", "Convolution"), (9, 9, "v1", "RELU")]
    assert layer_line(text, "v1") == 9 and layer_line(text, "a", "Pooling") is None


V1_LENET = """\
name: "LeNet"
layers {
  name: "mnist"
  type: DATA
  top: "data"
  top: "label"
  data_param {
    source: "examples/mnist/mnist_train_lmdb"
    backend: LMDB
    batch_size: 64
    scale: 0.00390625
  }
  include: { phase: TRAIN }
}
layers {
  name: "conv1"
  type: CONVOLUTION
  bottom: "data"
  top: "conv1"
  blobs_lr: 1
  blobs_lr: 2
  weight_decay: 1
  weight_decay: 0
  convolution_param {
    num_output: 20
    kernel_size: 5
    stride: 1
    weight_filler { type: "xavier" }
    bias_filler { type: "constant" }
  }
}
layers {
  name: "pool1"
  type: POOLING
  bottom: "conv1"
  top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 }
}
layers {
  name: "ip1"
  type: INNER_PRODUCT
  bottom: "pool1"
  top: "ip1"
  blobs_lr: 1
  blobs_lr: 2
  param: "ip1_w"
  inner_product_param { num_output: 500 weight_filler { type: "xavier" } }
}
layers {
  name: "relu1"
  type: RELU
  bottom: "ip1"
  top: "ip1"
}
layers {
  name: "accuracy"
  type: ACCURACY
  bottom: "ip1"
  bottom: "label"
  top: "accuracy"
  include: { phase: TEST }
}
layers {
  name: "loss"
  type: SOFTMAX_LOSS
  bottom: "ip1"
  bottom: "label"
  top: "loss"
  loss_weight: 1
}
"""


def test_v1_net_upgrades_to_layer(tmp_path):
    path = tmp_path / "lenet_v1.prototxt"
    path.write_text(V1_LENET)
    net = read_net_param(path)
    assert len(net.layers) == 0
    assert [(l.name, l.type) for l in net.layer] == [
        ("mnist", "Data"), ("conv1", "Convolution"), ("pool1", "Pooling"),
        ("ip1", "InnerProduct"), ("relu1", "ReLU"), ("accuracy", "Accuracy"),
        ("loss", "SoftmaxWithLoss")]
    data, conv, pool, ip, relu, acc, loss = net.layer
    assert list(data.top) == ["data", "label"]
    assert data.include[0].phase == caffe_pb2.TRAIN
    assert data.data_param.backend == caffe_pb2.DataParameter.LMDB
    # The transformation field moved out of data_param.
    assert not data.data_param.HasField("scale")
    assert data.transform_param.scale == pytest.approx(0.00390625)
    assert [(p.lr_mult, p.decay_mult) for p in conv.param] == [(1, 1), (2, 0)]
    assert conv.convolution_param.num_output == 20
    assert list(conv.convolution_param.kernel_size) == [5]
    assert conv.convolution_param.weight_filler.type == "xavier"
    assert pool.pooling_param.pool == caffe_pb2.PoolingParameter.MAX
    assert [(p.name, p.lr_mult, p.HasField("decay_mult")) for p in ip.param] == [
        ("ip1_w", 1, False), ("", 2, False)]
    assert list(relu.bottom) == list(relu.top) == ["ip1"]
    assert acc.include[0].phase == caffe_pb2.TEST
    assert list(loss.loss_weight) == [1]


def test_v1_upgrade_does_not_modify_its_argument():
    v1 = parse_text(V1_LENET, caffe_pb2.NetParameter)
    before = v1.SerializeToString()
    upgrade_net(v1)
    assert v1.SerializeToString() == before


def test_layer_and_layers_together_is_an_error(tmp_path):
    path = tmp_path / "mixed.prototxt"
    path.write_text('layer { name: "a" type: "ReLU" }\nlayers { name: "b" type: RELU }\n')
    with pytest.raises(PrototxtError, match=r"mixed\.prototxt: .*both V1 'layers'"):
        read_net_param(path)


# A V0 net of 2013 in the style of Caffe's imagenet deploy file: a padding layer before conv2,
# flat per-layer fields, lowercase types.
V0_NET = textwrap.dedent("""\
    name: "v0net"
    input: "data"
    input_dim: 2 input_dim: 3 input_dim: 12 input_dim: 12
    layers { layer { name: "conv1" type: "conv" num_output: 4 kernelsize: 3 stride: 1 group: 1
                     biasterm: true weight_filler { type: "gaussian" std: 0.1 }
                     bias_filler { type: "constant" value: 0.2 } blobs_lr: 1 blobs_lr: 2
                     weight_decay: 1 weight_decay: 0 }
             bottom: "data" top: "conv1" }
    layers { layer { name: "relu1" type: "relu" } bottom: "conv1" top: "conv1" }
    layers { layer { name: "pool1" type: "pool" pool: MAX kernelsize: 2 stride: 2 }
             bottom: "conv1" top: "pool1" }
    layers { layer { name: "norm1" type: "lrn" local_size: 3 alpha: 0.001 beta: 0.75 }
             bottom: "pool1" top: "norm1" }
    layers { layer { name: "pad2" type: "padding" pad: 1 } bottom: "norm1" top: "pad2" }
    layers { layer { name: "conv2" type: "conv" num_output: 6 kernelsize: 3 group: 2 }
             bottom: "pad2" top: "conv2" }
    layers { layer { name: "fc" type: "innerproduct" num_output: 5 local_size: 7 }
             bottom: "conv2" top: "fc" }
    layers { layer { name: "drop" type: "dropout" dropout_ratio: 0.3 } bottom: "fc" top: "fc" }
    layers { layer { name: "prob" type: "softmax" } bottom: "fc" top: "prob" }
    """)


def test_v0_net_is_upgraded_as_caffe_does(caplog):
    """UpgradeV0Net: the padding layer is folded into conv2 (its pad, its bottom), types and flat
    fields move to the current names, blobs_lr/weight_decay become ParamSpecs, a field that
    does not belong to its type (local_size on an inner product) is dropped with a warning."""
    from minicaffe import Net
    net = upgrade_net(parse_text(V0_NET, caffe_pb2.NetParameter))
    assert [lp.type for lp in net.layer] == ["Input", "Convolution", "ReLU", "Pooling", "LRN",
                                           "Convolution", "InnerProduct", "Dropout", "Softmax"]
    by = {lp.name: lp for lp in net.layer}
    assert "pad2" not in by and list(by["conv2"].bottom) == ["norm1"]
    c1, c2 = by["conv1"].convolution_param, by["conv2"].convolution_param
    assert (c1.num_output, list(c1.kernel_size), list(c1.stride), c1.group, c1.bias_term) == (
        4, [3], [1], 1, True)
    assert c1.weight_filler.std == pytest.approx(0.1) and c1.bias_filler.value == pytest.approx(0.2)
    assert [(p.lr_mult, p.decay_mult) for p in by["conv1"].param] == [(1, 1), (2, 0)]
    assert (list(c2.pad), c2.group, c2.num_output) == ([1], 2, 6)
    pp = by["pool1"].pooling_param
    assert (pp.pool, pp.kernel_size, pp.stride) == (caffe_pb2.PoolingParameter.MAX, 2, 2)
    lrn = by["norm1"].lrn_param
    assert (lrn.local_size, lrn.alpha, lrn.beta) == (3, pytest.approx(0.001), 0.75)
    assert by["drop"].dropout_param.dropout_ratio == pytest.approx(0.3)
    assert by["fc"].inner_product_param.num_output == 5
    assert "V0 field local_size does not apply to a 'innerproduct' layer" in caplog.text
    out = Net(net, "TEST").forward()
    assert out["prob"].shape == (2, 5)           # 12 -> conv 10 -> pool 5 -> pad 7 -> conv 5


def test_v0_data_layers_take_their_fields_and_transformation():
    net = upgrade_net(parse_text(textwrap.dedent("""\
        layers { layer { name: "d" type: "data" source: "train_lmdb" batchsize: 8 cropsize: 5
                         mirror: true scale: 0.5 meanfile: "mean.binaryproto" rand_skip: 3 }
                 top: "data" top: "label" }
        layers { layer { name: "w" type: "window_data" source: "w.txt" batchsize: 4
                         det_fg_threshold: 0.6 det_context_pad: 16 det_crop_mode: "square" }
                 top: "wdata" top: "wlabel" }
        """), caffe_pb2.NetParameter))
    d, w = net.layer
    assert d.type == "Data" and w.type == "WindowData"
    assert (d.data_param.source, d.data_param.batch_size, d.data_param.rand_skip) == (
        "train_lmdb", 8, 3)
    t = d.transform_param
    assert (t.crop_size, t.mirror, t.scale, t.mean_file) == (5, True, 0.5, "mean.binaryproto")
    wp = w.window_data_param
    assert (wp.fg_threshold, wp.context_pad, wp.crop_mode) == (
        pytest.approx(0.6), 16, "square")


@pytest.mark.parametrize("text, message", [
    ('layers { layer { name: "x" type: "nonsense" } top: "x" }', "unknown V0 layer type 'nonsense'"),
    ('input: "data" layers { layer { name: "p" type: "padding" pad: 1 } bottom: "data" top: "p" }'
     ' layers { layer { name: "r" type: "relu" } bottom: "p" top: "r" }',
     "a padding layer feeds a 'relu' layer"),
    ('layers { layer { name: "c" type: "conv" } bottom: "nowhere" top: "c" }',
     "unknown bottom blob 'nowhere'"),
])
def test_v0_nets_caffe_cannot_upgrade_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        upgrade_net(parse_text(text, caffe_pb2.NetParameter))


def test_legacy_input_dim_becomes_input_layer():
    net = parse_text(textwrap.dedent("""\
        name: "deploy"
        input: "data"
        input_dim: 10
        input_dim: 3
        input_dim: 227
        input_dim: 227
        layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
                convolution_param { num_output: 96 kernel_size: 11 stride: 4 } }
        """), caffe_pb2.NetParameter)
    up = upgrade_net(net)
    assert not up.input and not up.input_dim and not up.input_shape
    assert [l.name for l in up.layer] == ["input", "conv1"]
    first = up.layer[0]
    assert first.type == "Input" and list(first.top) == ["data"]
    assert [list(s.dim) for s in first.input_param.shape] == [[10, 3, 227, 227]]


def test_legacy_input_shape_with_several_inputs():
    net = parse_text(textwrap.dedent("""\
        input: "data"
        input_shape { dim: 1 dim: 3 dim: 4 dim: 4 }
        input: "label"
        input_shape { dim: 1 }
        layer { name: "loss" type: "EuclideanLoss" bottom: "data" bottom: "label" top: "loss" }
        """), caffe_pb2.NetParameter)
    up = upgrade_net(net)
    assert list(up.layer[0].top) == ["data", "label"]
    assert [list(s.dim) for s in up.layer[0].input_param.shape] == [[1, 3, 4, 4], [1]]
    assert up.layer[1].name == "loss"


def test_legacy_input_with_wrong_dim_count_is_an_error():
    net = parse_text('input: "data" input_dim: 1 input_dim: 3', caffe_pb2.NetParameter)
    with pytest.raises(ValueError, match="four per input"):
        upgrade_net(net)


def test_legacy_input_surplus_dims_and_shapes_are_ignored_as_caffe_does(caplog):
    """UpgradeNetInput reads input_dim(4i) .. input_dim(4i + 3), or input_shape(i), for each
    input i and checks no count: a fifth input_dim (a 5-d blob meant, say) or a second
    input_shape for one input is never read, and the net builds with the first four."""
    net = parse_text('input: "data" input_dim: 1 input_dim: 3 input_dim: 16 input_dim: 8 '
                     'input_dim: 8 layer { name: "r" type: "ReLU" bottom: "data" top: "r" }',
                     caffe_pb2.NetParameter)
    with caplog.at_level("WARNING"):
        up = upgrade_net(net)
    assert [list(s.dim) for s in up.layer[0].input_param.shape] == [[1, 3, 16, 8]]
    assert "the last 1 (8) are ignored" in caplog.text
    net = parse_text('input: "data" input_shape { dim: 2 dim: 5 } input_shape { dim: 7 }',
                     caffe_pb2.NetParameter)
    up = upgrade_net(net)
    assert list(up.layer[0].top) == ["data"]
    assert [list(s.dim) for s in up.layer[0].input_param.shape] == [[2, 5]]
    # too few: Caffe would read past the end of the repeated field; refused
    net = parse_text('input: "a" input: "b" input_shape { dim: 1 }', caffe_pb2.NetParameter)
    with pytest.raises(ValueError, match="exactly one input_shape per input"):
        upgrade_net(net)


def test_legacy_input_without_shape_is_dropped():
    net = parse_text('input: "data" layer { name: "r" type: "ReLU" }', caffe_pb2.NetParameter)
    up = upgrade_net(net)
    assert not up.input and [l.name for l in up.layer] == ["r"]


def test_old_batch_norm_params_are_frozen():
    net = parse_text(textwrap.dedent("""\
        layer { name: "bn" type: "BatchNorm" bottom: "x" top: "x"
                param { name: "m" lr_mult: 1 } param { lr_mult: 1 } param { lr_mult: 1 } }
        layer { name: "sc" type: "Scale" bottom: "x" top: "x"
                param { lr_mult: 1 } param { lr_mult: 1 } param { lr_mult: 1 } }
        """), caffe_pb2.NetParameter)
    up = upgrade_net(net)
    assert [(p.name, p.lr_mult, p.decay_mult) for p in up.layer[0].param] == [
        ("m", 0, 0), ("", 0, 0), ("", 0, 0)]
    assert [p.lr_mult for p in up.layer[1].param] == [1, 1, 1]


def test_solver_type_enum_upgrades(tmp_path):
    path = tmp_path / "solver.prototxt"
    path.write_text('net: "train_val.prototxt"\nbase_lr: 0.01\nsolver_type: ADAM\n'
                    'solver_mode: CPU\nstepvalue: 100\nstepvalue: 200\n')
    solver = read_solver_param(path)
    assert solver.type == "Adam" and not solver.HasField("solver_type")
    assert solver.solver_mode == caffe_pb2.SolverParameter.CPU
    assert list(solver.stepvalue) == [100, 200]
    both = parse_text('type: "SGD" solver_type: NESTEROV', caffe_pb2.SolverParameter)
    with pytest.raises(ValueError, match="both"):
        upgrade_solver(both)
    assert upgrade_solver(caffe_pb2.SolverParameter(type="RMSProp")).type == "RMSProp"


def test_binary_round_trip_with_blobs(tmp_path):
    net = parse_text(NEW_STYLE_NET, caffe_pb2.NetParameter)
    conv = net.layer[1]
    weight = conv.blobs.add()
    weight.shape.dim.extend([4, 3, 3, 3])
    weight.data.extend(float(i) / 8 for i in range(4 * 3 * 3 * 3))
    bias = conv.blobs.add()
    bias.shape.dim.append(4)
    bias.double_data.extend([0.1, -0.2, 0.3, 1e-300])
    legacy = net.layer[2].blobs.add()  # 4D legacy dimensions, as in old .caffemodel files
    legacy.num, legacy.channels, legacy.height, legacy.width = 1, 4, 1, 1
    legacy.data.extend([1, 2, 3, 4])
    path = tmp_path / "tiny.caffemodel"
    write_binary(net, path)
    again = read_binary(path, caffe_pb2.NetParameter)
    assert again == net
    assert list(again.layer[1].blobs[0].data) == [float(i) / 8 for i in range(108)]
    assert list(again.layer[1].blobs[1].double_data) == [0.1, -0.2, 0.3, 1e-300]
    assert again.layer[2].blobs[0].channels == 4
    assert os.listdir(tmp_path) == ["tiny.caffemodel"]


def test_bad_binary_names_the_file(tmp_path):
    path = tmp_path / "broken.caffemodel"
    path.write_bytes(b"\x0a\xff\xff\xff\xff\x0f")  # field 1, length far past the end
    with pytest.raises(BinaryProtoError, match=r"broken\.caffemodel.*caffe\.NetParameter"):
        read_binary(path, caffe_pb2.NetParameter)
    text = tmp_path / "net.prototxt"
    text.write_text(NEW_STYLE_NET)
    with pytest.raises(BinaryProtoError, match="looks like a text prototxt"):
        read_binary(text, caffe_pb2.NetParameter)


def test_v0_caffemodel_weights_load_by_layer_name(tmp_path):
    """A binary V0 model (blobs inside each V0 layer) is upgraded as it is read, as Caffe's
    CopyTrainedLayersFrom does, and its blobs land in the layers of the same name."""
    import numpy as np
    from minicaffe import Net
    v0 = parse_text(V0_NET, caffe_pb2.NetParameter)
    net = Net(upgrade_net(v0), "TEST")
    rng = np.random.default_rng(0)
    want = {}
    for conn in v0.layers:
        for blob in net.params.get(conn.layer.name, []):
            values = rng.standard_normal(blob.shape).astype(np.float32)
            b = conn.layer.blobs.add()
            b.shape.dim.extend(blob.shape)
            b.data.extend(values.ravel().tolist())
            want.setdefault(conn.layer.name, []).append(values)
    path = tmp_path / "v0.caffemodel"
    path.write_bytes(v0.SerializeToString())
    net.copy_from(str(path))
    assert sorted(want) == ["conv1", "conv2", "fc"]
    for name, arrays in want.items():
        for blob, values in zip(net.params[name], arrays):
            np.testing.assert_array_equal(np.asarray(blob.data), values)
