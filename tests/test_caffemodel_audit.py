"""Reading .caffemodel weights as BVLC Caffe reads them.

Each model here is built field by field with caffe_pb2, the way Caffe of its era wrote it
(V0 ``layers { layer { } }``, V1 ``layers`` with enum types and legacy num/channels/height/
width blobs, V2 ``layer`` with ``BlobShape``), and loaded into a V2 net.  The rules come
from upstream Caffe:

- src/caffe/net.cpp, ``Net::CopyTrainedLayersFrom(const NetParameter&)``: each source layer
  goes to the first net layer of its name; source layers the net lacks are ignored (logged
  "Ignoring source layer"); net layers the source lacks keep their fillers; a matched layer
  must have as many blobs ("Incompatible number of blobs for layer X"), each passing
  ``ShapeEquals`` ("Cannot copy param j weights from layer 'X'; shape mismatch. Source
  param shape is ...; target param shape is .... To learn this layer's parameters from
  scratch rather than copying from a saved net, rename the layer.").
  ``CopyTrainedLayersFrom(const string&)``: HDF5 files (H5Fis_hdf5) go to
  ``CopyTrainedLayersFromHDF5``, others to ``ReadNetParamsFromBinaryFileOrDie``.
- src/caffe/blob.cpp, ``Blob::ShapeEquals``: any of num/channels/height/width set means the
  legacy 4-d shape, matched against the blob's shape left-padded with ones (LegacyShape);
  otherwise ``shape.dim`` must equal the shape exactly (none: a 0-d blob).
  ``Blob::FromProto``: the same legacy-first shape; ``double_data`` when it holds values,
  else ``data``, each CHECK_EQ to the count; likewise ``double_diff`` / ``diff``.
- src/caffe/util/upgrade_proto.cpp, ``ReadNetParamsFromBinaryFileOrDie``: "Failed to parse
  NetParameter file", then ``UpgradeNetAsNeeded``: V0 -> V1 (blobs copied), data
  transformation fields, V1 -> V2 (refused when ``layer`` and ``layers`` are both set),
  input fields (an ``input`` without dims, a legacy caffemodel's, is dropped), BatchNorm's
  three ParamSpecs (lr_mult and decay_mult set to 0).
- src/caffe/util/io.cpp, ``ReadProtoFromBinaryFile``: a total bytes limit of INT_MAX.
"""
import os

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.net import Net
from minicaffe.proto import BinaryProtoError, caffe_pb2, parse_text

V1 = caffe_pb2.V1LayerParameter
rng = np.random.RandomState(20261122)


def P(text):
    return parse_text(text, caffe_pb2.NetParameter, filename="<audit net>")


# The V2 deploy net every model below is loaded into: conv (4,3,3,3) + bias, IP (6, 36) + bias.
NET = """name: "audit"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 5 dim: 5 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3
                            weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "fc" type: "InnerProduct" bottom: "conv1" top: "fc"
        inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.1 }
                              bias_filler { type: "constant" value: 0.5 } } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""
W_CONV = rng.randn(4, 3, 3, 3).astype(np.float32)
B_CONV = rng.randn(4).astype(np.float32)
W_FC = rng.randn(6, 36).astype(np.float32)
B_FC = rng.randn(6).astype(np.float32)
X = rng.randn(2, 3, 5, 5).astype(np.float32)


def reference_prob(w_conv=W_CONV, b_conv=B_CONV, w_fc=W_FC, b_fc=B_FC):
    """The net's forward in NumPy: valid 3x3 convolution, ReLU, InnerProduct, Softmax."""
    cols = np.stack([X[:, :, i:i + 3, j:j + 3].reshape(2, -1)
                     for i in range(3) for j in range(3)], axis=2)      # (2, 27, 9)
    conv = np.einsum("ok,nkp->nop", w_conv.reshape(4, -1), cols) + b_conv[None, :, None]
    fc = np.maximum(conv, 0).reshape(2, -1) @ w_fc.T + b_fc
    e = np.exp(fc - fc.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def shaped(proto, arr, dims=None):
    """A modern BlobShape blob (Caffe >= 2015's Blob::ToProto)."""
    proto.shape.dim.extend(arr.shape if dims is None else dims)
    proto.data.extend(arr.ravel().tolist())
    return proto


def legacy(proto, arr, nchw):
    """A legacy blob: num/channels/height/width only (Caffe before BlobShape, 2014)."""
    proto.num, proto.channels, proto.height, proto.width = nchw
    proto.data.extend(arr.ravel().tolist())
    return proto


def v2_model():
    m = caffe_pb2.NetParameter(name="audit")
    conv = m.layer.add(name="conv1", type="Convolution")
    conv.bottom.append("data")
    conv.top.append("conv1")
    shaped(conv.blobs.add(), W_CONV)
    shaped(conv.blobs.add(), B_CONV)
    fc = m.layer.add(name="fc", type="InnerProduct")
    shaped(fc.blobs.add(), W_FC)
    shaped(fc.blobs.add(), B_FC)
    return m


def write(tmp_path, model, name="w.caffemodel"):
    path = tmp_path / name
    path.write_bytes(model.SerializeToString() if not isinstance(model, bytes) else model)
    return str(path)


def deploy(tmp_path):
    path = tmp_path / "deploy.prototxt"
    path.write_text(NET)
    return str(path)


def params_of(net):
    return {name: [b.data.copy() for b in blobs] for name, blobs in net.params.items()}


def assert_loaded(net):
    np.testing.assert_array_equal(net.params["conv1"][0].data, W_CONV)
    np.testing.assert_array_equal(net.params["conv1"][1].data, B_CONV)
    np.testing.assert_array_equal(net.params["fc"][0].data, W_FC)
    np.testing.assert_array_equal(net.params["fc"][1].data, B_FC)
    out = net.forward(data=X)["prob"]
    np.testing.assert_allclose(out, reference_prob(), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ 1-3: the formats of each era

def test_v2_model_with_blob_shapes_loads_through_pycaffes_constructor(tmp_path):
    net = caffe.Net(deploy(tmp_path), write(tmp_path, v2_model()), caffe.TEST)
    assert_loaded(net)


def test_v1_model_with_legacy_dims_loads_into_a_v2_net(tmp_path):
    """bvlc_reference_caffenet.caffemodel's form: V1 ``layers`` with enum types, a DATA layer
    whose crop/mirror/mean sit in data_param (UpgradeNetDataTransformation), blobs_lr and
    weight_decay, an ``input`` without dims, and blobs with only num/channels/height/width:
    convolution 4-d, InnerProduct weights 1x1xNxK and biases 1x1x1xN."""
    m = caffe_pb2.NetParameter(name="CaffeNet")
    m.input.append("data")
    data = m.layers.add(name="data", type=V1.DATA)
    data.top.extend(["data", "label"])
    data.data_param.source = "ilsvrc12_train_leveldb"
    data.data_param.mean_file = "imagenet_mean.binaryproto"
    data.data_param.batch_size = 256
    data.data_param.crop_size = 227
    data.data_param.mirror = True
    conv = m.layers.add(name="conv1", type=V1.CONVOLUTION)
    conv.bottom.append("data")
    conv.top.append("conv1")
    conv.blobs_lr.extend([1, 2])
    conv.weight_decay.extend([1, 0])
    conv.convolution_param.num_output = 4
    conv.convolution_param.kernel_size.append(3)
    legacy(conv.blobs.add(), W_CONV, (4, 3, 3, 3))
    legacy(conv.blobs.add(), B_CONV, (1, 1, 1, 4))
    m.layers.add(name="relu1", type=V1.RELU, bottom=["conv1"], top=["conv1"])
    fc = m.layers.add(name="fc", type=V1.INNER_PRODUCT, bottom=["conv1"], top=["fc"])
    fc.inner_product_param.num_output = 6
    legacy(fc.blobs.add(), W_FC, (1, 1, 6, 36))
    legacy(fc.blobs.add(), B_FC, (1, 1, 1, 6))
    m.layers.add(name="loss", type=V1.SOFTMAX_LOSS, bottom=["fc", "label"], top=["loss"])
    net = caffe.Net(deploy(tmp_path), write(tmp_path, m), caffe.TEST)
    assert_loaded(net)


def test_v0_model_blobs_survive_both_upgrades(tmp_path):
    """A 2013 model: each ``layers`` entry wraps a V0 ``layer`` holding the blobs (field 50);
    UpgradeV0Net then UpgradeV1Net carry them over."""
    m = caffe_pb2.NetParameter(name="v0")
    m.input.append("data")
    for name, type_, blobs in (("conv1", "conv", [(W_CONV, (4, 3, 3, 3)),
                                                  (B_CONV, (1, 1, 1, 4))]),
                               ("relu1", "relu", []),
                               ("fc", "innerproduct", [(W_FC, (1, 1, 6, 36)),
                                                       (B_FC, (1, 1, 1, 6))])):
        conn = m.layers.add()
        conn.layer.name, conn.layer.type = name, type_
        for arr, nchw in blobs:
            legacy(conn.layer.blobs.add(), arr, nchw)
    net = Net(P(NET), caffe.TEST)
    net.copy_from(write(tmp_path, m))
    assert_loaded(net)


def test_double_data_is_read_and_wins_over_data(tmp_path):
    """Blob<double>::ToProto writes double_data/double_diff; FromProto reads double_data
    whenever it holds values (a float ``data`` beside it is not read)."""
    m = v2_model()
    for lp in m.layer:
        for blob in lp.blobs:
            values = np.asarray(blob.data, np.float64)
            del blob.data[:]
            blob.double_data.extend(values.tolist())
    m.layer[1].blobs[1].data.extend([99.0] * 6)        # ignored: double_data has values
    wide = Net(P(NET), caffe.TEST, dtype=np.float64)
    wide.copy_from(write(tmp_path, m))
    assert wide.params["fc"][0].data.dtype == np.float64
    np.testing.assert_array_equal(wide.params["fc"][1].data, B_FC.astype(np.float64))
    net = Net(P(NET), caffe.TEST)
    net.copy_from(write(tmp_path, m))
    assert_loaded(net)
    # a double value that float32 cannot hold is rounded as Caffe's float Blob assigns it
    m.layer[1].blobs[1].double_data[0] = 0.1
    net.copy_from(m)
    assert net.params["fc"][1].data[0] == np.float32(0.1)


def test_a_diff_is_copied_and_its_count_checked(tmp_path):
    m = v2_model()
    m.layer[1].blobs[1].double_diff.extend([0.25] * 6)
    net = Net(P(NET), caffe.TEST)
    net.copy_from(m)
    np.testing.assert_array_equal(net.params["fc"][1].diff, np.full(6, 0.25, np.float32))
    del m.layer[1].blobs[1].double_diff[:]
    m.layer[1].blobs[1].diff.extend([1.0] * 5)
    with pytest.raises(ValueError, match=r"param 1 weights from layer 'fc': blob proto of "
                                         r"shape \(6,\) holds 5 values in diff, expected 6"):
        net.copy_from(m)


# ------------------------------------------------------------------ 4: matching by name, checks

def test_extra_layers_are_ignored_and_missing_ones_keep_their_fillers(tmp_path, capsys):
    m = v2_model()
    del m.layer[0]                                      # no conv1: it keeps its filler
    extra = m.layer.add(name="fc8_imagenet", type="InnerProduct")
    shaped(extra.blobs.add(), np.ones((1000, 36), np.float32))
    m.layer.add(name="loss", type="SoftmaxWithLoss")
    net = Net(P(NET), caffe.TEST)
    conv_before = net.params["conv1"][0].data.copy()
    net.copy_from(write(tmp_path, m))
    np.testing.assert_array_equal(net.params["conv1"][0].data, conv_before)
    assert not np.any(net.params["conv1"][1].data)     # the default constant 0 bias filler
    np.testing.assert_array_equal(net.params["fc"][0].data, W_FC)
    assert "Ignoring source layer fc8_imagenet" in capsys.readouterr().err


def test_blob_count_mismatch_names_the_file_and_layer(tmp_path):
    m = v2_model()
    del m.layer[1].blobs[1]                 # a model trained with bias_term: false
    path = write(tmp_path, m)
    net = Net(P(NET), caffe.TEST)
    with pytest.raises(ValueError) as e:
        net.copy_from(path)
    assert str(e.value) == (f"{path}: incompatible number of blobs for layer 'fc': "
                            "source has 1, target 2")


def test_shape_mismatch_names_file_layer_param_and_both_shapes_and_copies_nothing(tmp_path):
    m = v2_model()
    fc = m.layer[1]
    del fc.blobs[:]
    shaped(fc.blobs.add(), np.zeros((10, 36), np.float32))
    shaped(fc.blobs.add(), np.zeros(10, np.float32))
    path = write(tmp_path, m)
    net = Net(P(NET), caffe.TEST)
    before = params_of(net)
    with pytest.raises(ValueError) as e:
        net.copy_from(path)
    assert str(e.value) == (
        f"{path}: cannot copy param 0 weights from layer 'fc'; shape mismatch: source param "
        "shape is (10, 36), target param shape is (6, 36). To learn this layer's parameters "
        "from scratch rather than copying from a saved net, rename the layer")
    # conv1 came first in the file and fitted; Caffe dies here, minicaffe leaves the net as is
    for name, blobs in before.items():
        for old, blob in zip(blobs, net.params[name]):
            np.testing.assert_array_equal(blob.data, old)


def test_legacy_dims_are_left_padded_but_a_blob_shape_must_match_exactly(tmp_path):
    """ShapeEquals pads the blob's shape with ones only for the legacy fields: a bias written
    as ``shape { dim: 1 dim: 1 dim: 1 dim: 6 }`` does not fit an (6,) bias in Caffe."""
    m = v2_model()
    bias = m.layer[1].blobs[1]
    bias.Clear()
    shaped(bias, B_FC, dims=(1, 1, 1, 6))
    net = Net(P(NET), caffe.TEST)
    with pytest.raises(ValueError, match=r"param 1 weights from layer 'fc'; shape mismatch: "
                                         r"source param shape is \(1, 1, 1, 6\), target"):
        net.copy_from(m)
    bias.Clear()
    legacy(bias, B_FC, (1, 1, 1, 6))
    net.copy_from(m)
    np.testing.assert_array_equal(net.params["fc"][1].data, B_FC)


def test_legacy_fields_win_over_a_blob_shape_and_unset_ones_are_zero(tmp_path):
    """Blob::FromProto/ShapeEquals look at num/channels/height/width first: where one is set,
    ``shape`` is not read, and the unset ones count as 0."""
    m = v2_model()
    weights = m.layer[1].blobs[0]
    weights.height, weights.width = 36, 6          # beside shape { 6 36 }: legacy 0x0x36x6
    net = Net(P(NET), caffe.TEST)
    with pytest.raises(ValueError, match=r"source param shape is \(0, 0, 36, 6\)"):
        net.copy_from(m)
    weights.num, weights.channels, weights.height, weights.width = 1, 1, 6, 36
    del weights.shape.dim[:]
    weights.shape.dim.extend([36, 6])               # wrong, but never read
    net.copy_from(m)
    np.testing.assert_array_equal(net.params["fc"][0].data, W_FC)


def test_a_blob_without_any_shape_is_0d(tmp_path):
    """No legacy field and no ``shape``: Caffe's shape is [] (one element), which fits no
    (6,) bias, whatever the number of values."""
    m = v2_model()
    del m.layer[1].blobs[1].shape.dim[:]
    m.layer[1].blobs[1].ClearField("shape")
    with pytest.raises(ValueError, match=r"source param shape is \(\), target param shape "
                                         r"is \(6,\)"):
        Net(P(NET), caffe.TEST).copy_from(m)


def test_value_count_must_match_the_shape(tmp_path):
    m = v2_model()
    del m.layer[0].blobs[0].data[-1]
    path = write(tmp_path, m)
    with pytest.raises(ValueError, match=rf"{path}: cannot copy param 0 weights from layer "
                                         r"'conv1': blob proto of shape \(4, 3, 3, 3\) holds "
                                         r"107 values in data, expected 108"):
        Net(P(NET), caffe.TEST).copy_from(path)


def test_source_layers_go_to_the_first_net_layer_of_their_name(tmp_path):
    """Two source layers of one name both copy into the first net layer of that name, the
    later one last."""
    m = v2_model()
    again = m.layer.add()
    again.CopyFrom(m.layer[1])
    again.blobs[1].data[:] = np.zeros(6, np.float32).tolist()
    net = Net(P(NET), caffe.TEST)
    net.copy_from(m)
    assert not np.any(net.params["fc"][1].data)


# ------------------------------------------------------------------ 5: BatchNorm, Scale, Bias

BN_NET = """name: "bn"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } } }
layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" %s }
layer { name: "scale" type: "Scale" bottom: "bn" top: "bn" scale_param { bias_term: true } }
layer { name: "bias" type: "Bias" bottom: "bn" top: "out" }
"""
OLD_BN_PARAMS = "param { lr_mult: 0 } param { lr_mult: 0 } param { lr_mult: 0 }"


@pytest.mark.parametrize("net_params", ["", OLD_BN_PARAMS])
def test_batch_norm_scale_and_bias_blobs_load(tmp_path, net_params):
    """A ResNet-era model: BatchNorm's three blobs (mean sum, variance sum, scale factor
    of shape (1,)), its old three ``param { lr_mult: 0 }`` written into the model
    (UpgradeNetBatchNorm zeroes them), then Scale (gamma, beta) and Bias."""
    mean, var = rng.rand(3).astype(np.float32), rng.rand(3).astype(np.float32) + 0.5
    factor = np.array([4.0], np.float32)
    gamma, beta, bias = (rng.randn(3).astype(np.float32) for _ in range(3))
    m = caffe_pb2.NetParameter(name="bn")
    bn = m.layer.add(name="bn", type="BatchNorm")
    for _ in range(3):
        bn.param.add(lr_mult=0)
    for arr in (mean, var, factor):
        shaped(bn.blobs.add(), arr)
    sc = m.layer.add(name="scale", type="Scale")
    shaped(sc.blobs.add(), gamma)
    shaped(sc.blobs.add(), beta)
    shaped(m.layer.add(name="bias", type="Bias").blobs.add(), bias)
    path = write(tmp_path, m)
    net = Net(P(BN_NET % net_params), caffe.TEST)
    net.copy_from(path)
    x = rng.randn(2, 3, 4, 4).astype(np.float32)
    out = net.forward(data=x)["out"]
    c = (slice(None), None, None)
    ref = (x - (mean / 4)[c]) / np.sqrt((var / 4)[c] + 1e-5) * gamma[c] + beta[c] + bias[c]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(net.params["bn"][2].data, factor)
    # the statistics are never trained, old param specs or not
    assert [net.param_lr_mult[i] for i in range(3)] == [0, 0, 0]


def test_batch_norm_blobs_shaped_1c11_are_refused_as_caffe_refuses_them(tmp_path):
    """Some forks wrote BatchNorm's statistics as (1, C, 1, 1); upstream Caffe's blobs are
    (C,), and ShapeEquals compares a ``shape`` exactly."""
    m = caffe_pb2.NetParameter()
    bn = m.layer.add(name="bn", type="BatchNorm")
    shaped(bn.blobs.add(), np.zeros(3, np.float32), dims=(1, 3, 1, 1))
    shaped(bn.blobs.add(), np.ones(3, np.float32), dims=(1, 3, 1, 1))
    shaped(bn.blobs.add(), np.ones(1, np.float32))
    with pytest.raises(ValueError, match=r"param 0 weights from layer 'bn'; shape mismatch: "
                                         r"source param shape is \(1, 3, 1, 1\), target "
                                         r"param shape is \(3,\)"):
        Net(P(BN_NET % ""), caffe.TEST).copy_from(write(tmp_path, m))


# ------------------------------------------------------------------ 6-7: files that are not models

def test_weights_in_text_format_are_refused_naming_the_file(tmp_path):
    """Caffe reads weights as binary only (ReadNetParamsFromBinaryFileOrDie); a text-format
    NetParameter, with or without a leading comment or blank line, does not parse as one."""
    from google.protobuf import text_format
    text = text_format.MessageToString(v2_model())
    for i, head in enumerate(("", "\n", "# weights\n", "  ")):
        path = tmp_path / f"text{i}.caffemodel"
        path.write_text(head + text)
        net = Net(P(NET), caffe.TEST)
        with pytest.raises(BinaryProtoError) as e:
            net.copy_from(str(path))
        assert str(path) in str(e.value) and "looks like a text prototxt" in str(e.value)


def test_a_model_with_both_layer_and_layers_is_refused(tmp_path):
    """UpgradeV1Net: "Refusing to upgrade inconsistent NetParameter input"."""
    m = v2_model()
    m.layers.add(name="conv1", type=V1.CONVOLUTION)
    path = write(tmp_path, m)
    with pytest.raises(ValueError, match=rf"{path}: the net specifies both V1 'layers' \(1\) "
                                         r"and new-style 'layer' \(2\)"):
        Net(P(NET), caffe.TEST).copy_from(path)


def test_a_truncated_model_is_an_error_naming_the_file_and_loads_nothing(tmp_path):
    whole = v2_model().SerializeToString()
    for cut in (1, 6, len(whole) // 3, len(whole) // 2, len(whole) - 1):
        path = write(tmp_path, whole[:cut], name=f"cut{cut}.caffemodel")
        net = Net(P(NET), caffe.TEST)
        before = params_of(net)
        with pytest.raises(BinaryProtoError, match=rf"{path}: not a valid binary "
                                                   rf"caffe.NetParameter \({cut} bytes\)"):
            net.copy_from(path)
        for name, blobs in before.items():
            for old, blob in zip(blobs, net.params[name]):
                np.testing.assert_array_equal(blob.data, old)


def test_a_model_cut_at_a_layer_boundary_parses_and_is_warned_about(tmp_path, capsys):
    """A cut between two top-level fields leaves a valid NetParameter: Caffe loads what is
    there and says nothing; minicaffe loads the same and warns which layers kept their
    initial values."""
    m = v2_model()
    whole = m.SerializeToString()
    head = caffe_pb2.NetParameter(name=m.name, layer=[m.layer[0]]).SerializeToString()
    assert whole.startswith(head)                    # the file cut right after conv1
    path = write(tmp_path, head)
    net = Net(P(NET), caffe.TEST)
    net.copy_from(path)
    np.testing.assert_array_equal(net.params["conv1"][0].data, W_CONV)
    err = capsys.readouterr().err
    assert (f"{path}: 1 layer(s) with parameters not in the weights, keeping their initial "
            "values: fc") in err
    path = write(tmp_path, whole[:7], name="name_only.caffemodel")   # name: "audit" only
    net.copy_from(path)
    assert "2 layer(s) with parameters not in the weights" in capsys.readouterr().err


def test_an_empty_or_missing_model_file_is_an_error(tmp_path):
    """Caffe parses a 0-byte file as an empty NetParameter and copies nothing; minicaffe
    says so instead of keeping every filler silently."""
    path = write(tmp_path, b"")
    with pytest.raises(ValueError, match=rf"{path}: the weights file is empty"):
        Net(P(NET), caffe.TEST).copy_from(path)
    with pytest.raises(FileNotFoundError, match="absent.caffemodel"):
        Net(P(NET), caffe.TEST).copy_from(str(tmp_path / "absent.caffemodel"))


def test_a_model_over_caffes_2gb_read_limit_is_refused_before_reading(tmp_path):
    """ReadProtoFromBinaryFile limits a parse to INT_MAX bytes; the (sparse) file here is
    one byte over, and is refused from its size alone."""
    path = tmp_path / "huge.caffemodel"
    with open(path, "wb") as f:
        f.truncate(2**31)
    with pytest.raises(BinaryProtoError, match=rf"{path}: 2147483648 bytes, more than the "
                                               r"2147483647 bytes"):
        Net(P(NET), caffe.TEST).copy_from(str(path))


# ------------------------------------------------------------------ 8: shared parameters

SHARED_NET = """name: "siamese"
layer { name: "data" type: "Input" top: "a" top: "b"
        input_param { shape { dim: 2 dim: 4 } shape { dim: 2 dim: 4 } } }
layer { name: "ip_a" type: "InnerProduct" bottom: "a" top: "fa"
        param { name: "w" } param { name: "bias" }
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "ip_b" type: "InnerProduct" bottom: "b" top: "fb"
        param { name: "w" } param { name: "bias" }
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 } } }
"""


def shared_model(*layers):
    m = caffe_pb2.NetParameter()
    for name, w in layers:
        lp = m.layer.add(name=name, type="InnerProduct")
        shaped(lp.blobs.add(), w)
        shaped(lp.blobs.add(), np.full(3, w[0, 0], np.float32))
    return m


def test_shared_params_take_the_last_copy_in_the_file(tmp_path):
    """Net::ToProto writes a shared param under every layer that uses it; copying into the
    sharer's blob writes the owner's memory, so the later layer's values stay."""
    wa, wb = (rng.randn(3, 4).astype(np.float32) for _ in range(2))
    net = Net(P(SHARED_NET), caffe.TEST)
    net.copy_from(write(tmp_path, shared_model(("ip_a", wa), ("ip_b", wb))))
    for layer in ("ip_a", "ip_b"):
        np.testing.assert_array_equal(net.params[layer][0].data, wb)
    assert len(net.learnable_params) == 2


def test_a_model_with_only_the_sharing_layer_fills_the_owner(tmp_path):
    wb = rng.randn(3, 4).astype(np.float32)
    net = Net(P(SHARED_NET), caffe.TEST)
    net.copy_from(write(tmp_path, shared_model(("ip_b", wb))))
    np.testing.assert_array_equal(net.params["ip_a"][0].data, wb)
    x = rng.randn(2, 4).astype(np.float32)
    out = net.forward(a=x, b=x)
    np.testing.assert_array_equal(out["fa"], out["fb"])


def test_hdf5_weights_check_every_layer_before_copying(tmp_path):
    """CopyTrainedLayersFromHDF5 (a shared param needs its owner's dataset only); a dataset
    of the wrong shape in a later layer leaves the net as it was."""
    pytest.importorskip("h5py")
    net = Net(P(SHARED_NET), caffe.TEST)
    path = str(tmp_path / "w.caffemodel.h5")
    net.save_hdf5(path)
    fresh = Net(P(SHARED_NET), caffe.TEST)
    fresh.copy_from(path)
    np.testing.assert_array_equal(fresh.params["ip_b"][0].data, net.params["ip_a"][0].data)
    big = Net(P(NET), caffe.TEST)
    big_path = str(tmp_path / "big.caffemodel.h5")
    big.save_hdf5(big_path)
    import h5py
    with h5py.File(big_path, "r+") as f:
        del f["data/fc/1"]
        f["data/fc"].create_dataset("1", data=np.zeros(7, np.float32))
    target = Net(P(NET), caffe.TEST)
    before = params_of(target)
    with pytest.raises(ValueError, match=r"param 1 weights from layer 'fc'"):
        target.copy_from(big_path)
    np.testing.assert_array_equal(target.params["conv1"][0].data, before["conv1"][0])
