"""minicaffe.netspec: pycaffe's NetSpec, the L layer factory and the P enum constants."""
import os
import subprocess
import sys

import numpy as np
import pytest
from google.protobuf import text_format

import minicaffe
import minicaffe.layers  # the implementations (importing registers them)
from minicaffe import netspec
from minicaffe.netspec import L, NetSpec, P, to_proto
from minicaffe.proto import caffe_pb2, parse_text

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lenet_spec():
    n = NetSpec()
    n.data, n.label = L.Data(source="train_lmdb", backend=P.Data.LMDB, batch_size=64, ntop=2,
                             transform_param=dict(scale=1. / 256), include=dict(phase=TRAIN))
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, stride=1,
                            weight_filler=dict(type="xavier"), bias_filler=dict(type="constant"),
                            param=[dict(lr_mult=1), dict(lr_mult=2)])
    n.relu1 = L.ReLU(n.conv1, in_place=True)
    n.pool1 = L.Pooling(n.relu1, pool=P.Pooling.MAX, kernel_size=2, stride=2)
    n.ip1 = L.InnerProduct(n.pool1, num_output=10, weight_filler=dict(type="xavier"))
    n.accuracy = L.Accuracy(n.ip1, n.label, include=dict(phase=TEST))
    n.loss = L.SoftmaxWithLoss(n.ip1, n.label)
    return n


LENET_TEXT = """
layer { name: "data" type: "Data" top: "data" top: "label"
        include { phase: TRAIN }
        transform_param { scale: 0.00390625 }
        data_param { source: "train_lmdb" batch_size: 64 backend: LMDB } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        param { lr_mult: 1 } param { lr_mult: 2 }
        convolution_param { num_output: 20 kernel_size: 5 stride: 1
                            weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
        inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "accuracy" type: "Accuracy" bottom: "ip1" bottom: "label" top: "accuracy"
        include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip1" bottom: "label" top: "loss" }
"""


# ------------------------------------------------------------- round trips
def test_netspec_matches_handwritten_prototxt():
    assert _lenet_spec().to_proto() == parse_text(LENET_TEXT, caffe_pb2.NetParameter)


def test_round_trip_through_text_is_identical():
    net = _lenet_spec().to_proto()
    net.name = "LeNet"
    text = text_format.MessageToString(net)
    back = parse_text(text, caffe_pb2.NetParameter)
    assert back == net
    assert text_format.MessageToString(back) == text


def test_to_proto_is_deterministic():
    a = text_format.MessageToString(_lenet_spec().to_proto())
    b = text_format.MessageToString(_lenet_spec().to_proto())
    assert a == b


# ------------------------------------------------------------ kwarg routing
def test_kwargs_go_to_the_type_param_message():
    layer = L.Convolution(L.Input(), kernel_size=3, num_output=64, pad=1, group=2,
                          weight_filler=dict(type="msra"), engine=P.Convolution.CAFFE
                          ).to_proto().layer[1]
    cp = layer.convolution_param
    assert list(cp.kernel_size) == [3] and list(cp.pad) == [1]  # scalars into repeated fields
    assert cp.num_output == 64 and cp.group == 2 and cp.weight_filler.type == "msra"
    assert cp.engine == caffe_pb2.ConvolutionParameter.CAFFE


def test_layer_level_fields_and_param_fields():
    x = L.Input(shape=dict(dim=[2, 3, 4, 4]))
    layer = L.Convolution(x, num_output=4, kernel_size=1, loss_weight=0.5,
                          propagate_down=[True], include=dict(phase=TEST, stage=["s"]),
                          param=[dict(lr_mult=1, decay_mult=1), dict(lr_mult=2, decay_mult=0)]
                          ).to_proto().layer[1]
    assert list(layer.loss_weight) == [0.5]
    assert list(layer.propagate_down) == [True]
    assert len(layer.include) == 1 and layer.include[0].phase == TEST
    assert list(layer.include[0].stage) == ["s"]
    assert [(p.lr_mult, p.decay_mult) for p in layer.param] == [(1, 1), (2, 0)]
    assert not layer.HasField("inner_product_param")


def test_every_star_param_field_routes_by_type():
    """param_name_dict covers every LayerParameter *_param message, as pycaffe builds it."""
    names = netspec.param_name_dict()
    assert names["Convolution"] == "convolution"
    assert names["InnerProduct"] == "inner_product"
    assert names["BatchNorm"] == "batch_norm"
    assert names["DummyData"] == "dummy_data"
    assert names["LRN"] == "lrn"
    assert names["ReLU"] == "relu"
    assert names["HDF5Data"] == "hdf5_data"
    for field in caffe_pb2.LayerParameter.DESCRIPTOR.fields:
        if field.name.endswith("_param"):
            stem = field.message_type.name[: -len("Parameter")]
            assert names[stem] + "_param" == field.name


def test_types_whose_params_live_in_another_message():
    x = L.Input()
    deconv = L.Deconvolution(x, num_output=3, kernel_size=4, stride=2).to_proto().layer[1]
    assert deconv.convolution_param.num_output == 3
    loss = L.SoftmaxWithLoss(x, x, axis=2, loss_param=dict(ignore_label=-1)).to_proto().layer[1]
    assert loss.softmax_param.axis == 2 and loss.loss_param.ignore_label == -1


def test_enum_by_name_and_message_instances():
    x = L.Input()
    layer = L.Pooling(x, pool="AVE", kernel_size=3).to_proto().layer[1]
    assert layer.pooling_param.pool == caffe_pb2.PoolingParameter.AVE
    filler = caffe_pb2.FillerParameter(type="gaussian", std=0.01)
    layer = L.InnerProduct(x, num_output=2, weight_filler=filler).to_proto().layer[1]
    assert layer.inner_product_param.weight_filler == filler
    data, _ = L.Data(ntop=2, transform_param=dict(mean_value=[104, 117, 123]))
    layer = data.to_proto().layer[0]
    assert list(layer.transform_param.mean_value) == [104, 117, 123]


def test_name_keyword_overrides_the_layer_name_only():
    n = NetSpec()
    n.x = L.Input()
    n["loss1/loss1"] = L.SoftmaxWithLoss(n.x, n.x, name="loss1/loss", loss_weight=0.3)
    layer = n.to_proto().layer[1]
    assert layer.name == "loss1/loss" and list(layer.top) == ["loss1/loss1"]


def test_unknown_keyword_fails_at_the_call_with_a_suggestion():
    with pytest.raises(AttributeError, match=r"L\.Convolution.*'kernal_size'.*kernel_size"):
        L.Convolution(L.Input(), kernal_size=3)
    with pytest.raises(AttributeError, match=r"L\.Silence.*'foo'.*LayerParameter"):
        L.Silence(L.Input(), foo=1, ntop=0)


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match="PoolMethod.*MAX, AVE, STOCHASTIC"):
        L.Pooling(L.Input(), pool="MEAN")
    with pytest.raises(TypeError, match=r"ConvolutionParameter\.num_output"):
        L.Convolution(L.Input(), num_output="many")
    with pytest.raises(TypeError, match="expects a dict"):
        L.Convolution(L.Input(), weight_filler="xavier")


# ---------------------------------------------------- in place, ntop, names
def test_in_place_layer_reuses_the_bottom_name():
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 2, 2]))
    n.conv = L.Convolution(n.data, num_output=1, kernel_size=1)
    n.relu = L.ReLU(n.conv, in_place=True)
    n.drop = L.Dropout(n.relu, in_place=True, dropout_ratio=0.3)
    n.out = L.Pooling(n.drop, kernel_size=2)
    by_name = {l.name: l for l in n.to_proto().layer}
    assert list(by_name["relu"].bottom) == list(by_name["relu"].top) == ["conv"]
    assert list(by_name["drop"].bottom) == list(by_name["drop"].top) == ["conv"]
    assert by_name["drop"].dropout_param.dropout_ratio == pytest.approx(0.3)
    assert list(by_name["out"].bottom) == ["conv"]


def test_ntop_tuple_zero_and_auto_names():
    a, b = L.Slice(L.Input(), ntop=2, slice_point=[1])
    silence = L.Silence(a, b, ntop=0)
    assert isinstance(silence, netspec.Function)
    net = to_proto(silence)
    assert [l.type for l in net.layer] == ["Input", "Slice", "Silence"]
    assert list(net.layer[1].top) == ["Slice1", "Slice2"]
    assert net.layer[1].name == "Slice1"
    assert list(net.layer[2].bottom) == ["Slice1", "Slice2"] and not len(net.layer[2].top)
    assert net.layer[2].name == "Silence1"


def test_module_to_proto_with_several_tops_and_shared_inputs():
    x = L.Input()
    conv = L.Convolution(x, num_output=2, kernel_size=1)
    y1 = L.ReLU(conv)
    y2 = L.Sigmoid(conv)
    net = to_proto(y1, y2)
    assert [l.name for l in net.layer] == ["Input1", "Convolution1", "ReLU1", "Sigmoid1"]
    assert y1.to_proto() == to_proto(y1)


def test_layers_reached_twice_appear_once():
    n = NetSpec()
    n.data = L.Input()
    n.a = L.ReLU(n.data)
    n.b = L.Eltwise(n.a, n.a)
    n.c = L.Eltwise(n.a, n.b)
    assert [l.name for l in n.to_proto().layer] == ["data", "a", "b", "c"]


def test_netspec_item_access_and_errors():
    n = NetSpec()
    n["conv1/7x7_s2"] = L.Input()
    assert "conv1/7x7_s2" in n and n.keys() == ["conv1/7x7_s2"]
    assert n["conv1/7x7_s2"] is n.vals()[0]
    with pytest.raises(AttributeError, match="no top 'missing'"):
        n.missing
    with pytest.raises(TypeError, match="ntop > 1 returns a tuple"):
        n.pair = L.Data(ntop=2)
    with pytest.raises(TypeError, match=r"^ReLU input 0 is not a Top \(type is <class .tuple.>\)$"):
        L.ReLU(L.Data(ntop=2))
    with pytest.raises(ValueError, match="in_place"):
        L.ReLU(in_place=True)


# -------------------------------------------------------------------- P
def test_params_enum_constants():
    assert P.Pooling.MAX == caffe_pb2.PoolingParameter.MAX == 0
    assert P.Pooling.AVE == 1 and P.Pooling.STOCHASTIC == 2
    assert P.Eltwise.PROD == 0 and P.Eltwise.SUM == 1 and P.Eltwise.MAX == 2
    assert P.Data.LMDB == 1 and P.LRN.WITHIN_CHANNEL == 1
    assert P.Loss.VALID == caffe_pb2.LossParameter.VALID
    with pytest.raises(AttributeError, match="MAX, AVE, STOCHASTIC"):
        P.Pooling.MEDIAN
    with pytest.raises(AttributeError, match="no message NopeParameter"):
        P.Nope.X


# --------------------------------------------------- pycaffe-style imports
def test_pycaffe_style_module_aliases():
    from minicaffe import layers as layers_mod, params
    assert params.Pooling.MAX == 0
    assert minicaffe.NetSpec is NetSpec
    # minicaffe.layers is the package of implementations and a layer factory at once
    assert hasattr(minicaffe.layers, "conv")
    top = minicaffe.layers.Convolution(minicaffe.layers.Input(), num_output=1, kernel_size=1)
    assert isinstance(top, netspec.Top)
    assert isinstance(layers_mod.ReLU(top), netspec.Top)
    with pytest.raises(AttributeError):
        minicaffe.layers.no_such_module


def test_fresh_interpreter_imports():
    """``from minicaffe import layers as L`` first thing in a process, and Net
    building without ever naming the layers package, both find every layer."""
    code = ("import minicaffe\n"
            "assert 'Convolution' in minicaffe.known_layer_types()\n"
            "from minicaffe import layers as L, params as P\n"
            "assert L.__name__ == 'minicaffe.layers' and hasattr(L, 'conv')\n"
            "top = L.Pooling(L.Input(), pool=P.Pooling.AVE, kernel_size=2)\n"
            "print(top.to_proto().layer[1].type)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Pooling"


# ------------------------------------------------------- into a real Net
def test_netspec_net_runs():
    n = NetSpec()
    n.data, n.label = L.DummyData(ntop=2, shape=[dict(dim=[4, 3, 6, 6]), dict(dim=[4])],
                                  data_filler=[dict(type="gaussian", std=1), dict(type="constant",
                                                                                   value=1)])
    n.conv = L.Convolution(n.data, num_output=5, kernel_size=3, pad=1,
                           weight_filler=dict(type="xavier"))
    n.relu = L.ReLU(n.conv, in_place=True)
    n.pool = L.Pooling(n.relu, pool=P.Pooling.AVE, global_pooling=True)
    n.ip = L.InnerProduct(n.pool, num_output=3, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.ip, n.label)
    minicaffe.set_random_seed(0)
    net = minicaffe.Net(n.to_proto(), minicaffe.TRAIN)
    assert net.layer_names == ["data", "conv", "relu", "pool", "ip", "loss"]
    assert net.blobs["pool"].shape == (4, 5, 1, 1)
    loss = float(np.asarray(minicaffe.backend.to_numpy(net.forward_backward())))
    assert np.isfinite(loss) and loss > 0
    assert np.abs(minicaffe.backend.to_numpy(net.params["conv"][0].diff)).sum() > 0
