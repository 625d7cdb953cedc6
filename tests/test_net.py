"""Net construction as Caffe's net.cpp: filtering, splits, in-place, backward
needs, param sharing, errors, and caffemodel I/O."""
import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.net import Net, insert_splits
from minicaffe.proto import caffe_pb2, parse_text


def net_param(text):
    return parse_text(text, caffe_pb2.NetParameter, filename="<test net>")


MLP = """
name: "mlp"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip2" bottom: "label" top: "acc"
        include { phase: TEST } }
"""


def test_phase_filtering_and_splits():
    train = Net(net_param(MLP), caffe.TRAIN)
    test = Net(net_param(MLP), caffe.TEST)
    assert "acc" not in train.layer_names
    assert "acc" in test.layer_names
    # ip2 feeds loss and acc in TEST: Caffe inserts a Split after it, named as Caffe names it
    assert "ip2_ip2_0_split" in test.layer_names
    assert "ip2_ip2_0_split" not in train.layer_names
    split = test.layers[test.layer_index("ip2_ip2_0_split")]
    assert split.type == "Split"
    assert test.top_names["ip2_ip2_0_split"] == ["ip2_ip2_0_split_0", "ip2_ip2_0_split_1"]
    assert test.layer_top_names[test.layer_index("ip2_ip2_0_split")] == ["ip2_ip2_0_split_0",
                                                                         "ip2_ip2_0_split_1"]
    # the label feeds two layers too
    assert "label_data_1_split" in test.layer_names


def test_split_after_last_inplace_writer():
    p = net_param("""
    layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
    layer { name: "relu" type: "ReLU" bottom: "x" top: "x" }
    layer { name: "a" type: "ReLU" bottom: "x" top: "a" }
    layer { name: "b" type: "ReLU" bottom: "x" top: "b" }
    """)
    s = insert_splits(p)
    names = [l.name for l in s.layer]
    assert names == ["in", "relu", "x_relu_0_split", "a", "b"]
    assert list(s.layer[3].bottom) == ["x_relu_0_split_0"]
    assert list(s.layer[4].bottom) == ["x_relu_0_split_1"]


def test_split_with_loss_weight_counts_as_reader():
    p = net_param("""
    layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
    layer { name: "e" type: "ReLU" bottom: "x" top: "y" loss_weight: 2 }
    layer { name: "f" type: "ReLU" bottom: "y" top: "z" }
    """)
    s = insert_splits(p)
    split = [l for l in s.layer if l.type == "Split"][0]
    assert split.name == "y_e_0_split"
    assert list(split.loss_weight) == [2.0, 0.0]
    assert len(s.layer[1].loss_weight) == 0
    assert list(s.layer[3].bottom) == ["y_e_0_split_1"]


def test_stage_and_level_rules():
    p = net_param("""
    layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 2 } } }
    layer { name: "deploy_only" type: "ReLU" bottom: "x" top: "d" include { stage: "deploy" } }
    layer { name: "not_deploy" type: "ReLU" bottom: "x" top: "n" exclude { stage: "deploy" } }
    layer { name: "lvl" type: "ReLU" bottom: "x" top: "l" include { min_level: 2 } }
    """)
    a = Net(p, caffe.TEST)
    assert a.layer_names == ["in", "not_deploy"]
    b = Net(p, caffe.TEST, stages=["deploy"], level=3)
    assert "deploy_only" in b.layer_names and "not_deploy" not in b.layer_names
    assert "lvl" in b.layer_names


STATEFUL = """
name: "stateful"
state { stage: "deploy" level: 5 }
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 2 } } }
layer { name: "deploy_only" type: "ReLU" bottom: "x" top: "d" include { stage: "deploy" } }
layer { name: "both" type: "ReLU" bottom: "x" top: "b" include { stage: "deploy" stage: "big" } }
layer { name: "lvl" type: "ReLU" bottom: "x" top: "l" include { min_level: 1 } }
"""


def test_file_state_block_is_the_starting_net_state(tmp_path):
    """Caffe's Net(file, phase, level, stages) keeps the file's own ``state { }``: the phase
    and level are replaced, the stages are added to the file's (net.cpp)."""
    path = tmp_path / "stateful.prototxt"
    path.write_text(STATEFUL)
    net = Net(str(path), caffe.TEST)
    assert net.layer_names == ["in", "deploy_only"]     # the file's stage; level 0, not 5
    assert list(net.state.stage) == ["deploy"] and net.state.level == 0
    net = Net(str(path), caffe.TEST, stages=["big"], level=1)
    assert net.layer_names[-3:] == ["deploy_only", "both", "lvl"]
    assert list(net.state.stage) == ["deploy", "big"]
    assert Net(str(path), caffe.TRAIN, stages=None).phase == caffe.TRAIN   # pycaffe's default
    assert Net(net_param(STATEFUL), caffe.TEST).layer_names == ["in", "deploy_only"]


def test_inplace_shares_blob_and_forward_matches_manual():
    net = Net(net_param(MLP), caffe.TRAIN, dtype=np.float64)
    assert net.blobs["ip1"] is net.top_vecs[net.layer_index("relu1")][0]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3))
    y = np.array([0, 1, 2, 1])
    out = net.forward(data=x, label=y)
    w1, b1 = (p.data for p in net.params["ip1"])
    w2, b2 = (p.data for p in net.params["ip2"])
    h = np.maximum(x @ w1.T + b1, 0)
    z = h @ w2.T + b2
    z -= z.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    assert out["loss"] == pytest.approx(-logp[np.arange(4), y].mean())


def test_backward_needs():
    net = Net(net_param(MLP), caffe.TRAIN)
    i = net.layer_names.index
    assert not net.layer_need_backward[i("data")]
    assert net.layer_need_backward[i("ip1")]
    assert net.bottom_need_backward[i("ip1")] == [False]          # data gets no diff
    assert net.bottom_need_backward[i("loss")] == [True, False]   # label gets no diff
    assert not net.blobs["data"].has_diff


def test_force_backward_and_propagate_down():
    text = MLP.replace('name: "mlp"', 'name: "mlp" force_backward: true')
    net = Net(net_param(text), caffe.TRAIN)
    i = net.layer_names.index
    assert net.bottom_need_backward[i("ip1")] == [True]
    assert net.bottom_need_backward[i("loss")] == [True, False]  # labels never
    pd = MLP.replace('bottom: "ip1" top: "ip2"', 'bottom: "ip1" top: "ip2" propagate_down: false')
    net2 = Net(net_param(pd), caffe.TRAIN)
    assert net2.bottom_need_backward[net2.layer_names.index("ip2")] == [False]
    # Caffe: nothing below a propagate_down: false bottom runs backward, params included
    assert not net2.layer_need_backward[net2.layer_names.index("relu1")]
    assert not net2.layer_need_backward[net2.layer_names.index("ip1")]


def test_lr_mult_zero_means_no_param_diff():
    text = MLP.replace('top: "ip1"\n', 'top: "ip1" param { lr_mult: 0 } param { lr_mult: 0 }\n', 1)
    net = Net(net_param(text), caffe.TRAIN)
    ip1 = net.layers[net.layer_index("ip1")]
    assert ip1.param_propagate_down == [False, False]
    assert not net.layer_need_backward[net.layer_index("ip1")]


def test_shared_params_accumulate_into_owner():
    p = net_param("""
    layer { name: "in" type: "Input" top: "x" top: "t"
            input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 3 } } }
    layer { name: "a" type: "InnerProduct" bottom: "x" top: "a" param { name: "w" } param { name: "b" }
            inner_product_param { num_output: 3 weight_filler { type: "gaussian" } } }
    layer { name: "b" type: "InnerProduct" bottom: "a" top: "b" param { name: "w" } param { name: "b" }
            inner_product_param { num_output: 3 } }
    layer { name: "loss" type: "EuclideanLoss" bottom: "b" bottom: "t" top: "loss" }
    """)
    net = Net(p, caffe.TRAIN, dtype=np.float64)
    a, b = net.params["a"], net.params["b"]
    assert np.shares_memory(a[0].data, b[0].data)
    assert len(net.learnable_params) == 2
    rng = np.random.default_rng(1)
    net.blobs["x"].data[...] = rng.standard_normal((2, 3))
    net.blobs["t"].data[...] = rng.standard_normal((2, 3))
    net.clear_param_diffs()
    net.forward_backward()
    # numerical derivative w.r.t. the shared weight
    w = a[0].data
    g = a[0].diff.copy()
    eps = 1e-6
    w[0, 1] += eps
    fp = float(net.forward_from_to())
    w[0, 1] -= 2 * eps
    fm = float(net.forward_from_to())
    w[0, 1] += eps
    assert g[0, 1] == pytest.approx((fp - fm) / (2 * eps), rel=1e-5)


@pytest.mark.parametrize("text, message", [
    ('layer { name: "x" type: "NoSuchLayer" top: "x" }', "known types"),
    ('layer { name: "r" type: "ReLU" bottom: "nope" top: "r" }', "unknown bottom blob 'nope'"),
    ('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 } } }'
     'layer { name: "in2" type: "Input" top: "x" input_param { shape { dim: 1 } } }',
     "produced by multiple sources"),
    ('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 } } }'
     'layer { name: "r" type: "ReLU" bottom: "x" bottom: "x" top: "r" }', "bottom blob"),
    ('layer { name: "in" type: "Input" top: "x" top: "y" '
     'input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 4 } } }'
     'layer { name: "e" type: "Eltwise" bottom: "x" bottom: "y" top: "e" }', "layer 'e'"),
])
def test_errors_name_the_culprit(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Net(net_param(text), caffe.TEST)



def test_unknown_bottom_names_the_layers_line(tmp_path):
    """AlfredXiangWu/face_verification_experiment's LightenedCNN_B_deploy.prototxt keeps a V1
    ACCURACY layer reading 'label' in phase TEST: Caffe stops with "Unknown bottom blob 'label'
    (layer 'accuracy', bottom index 1)"; the error also says where that layer is in the file."""
    path = tmp_path / "deploy.prototxt"
    path.write_text('name: "n"\ninput: "data"\ninput_dim: 1\ninput_dim: 2\ninput_dim: 1\ninput_dim: 1\n'
                    'layers {\n  name: "fc"\n  type: INNER_PRODUCT\n  bottom: "data"\n  top: "fc"\n'
                    '  inner_product_param { num_output: 3 }\n}\n'
                    'layers {\n  name: "accuracy"\n  type: ACCURACY\n  bottom: "fc"\n'
                    '  bottom: "label"\n  top: "accuracy"\n  include: { phase: TEST }\n}\n')
    with pytest.raises(ValueError, match=r"deploy\.prototxt:14: .*layer 'accuracy': unknown "
                                         r"bottom blob 'label' \(bottom index 1\)"):
        Net(str(path), caffe.TEST)
    assert Net(str(path), caffe.TRAIN).blobs["fc"].data.shape == (1, 3)


PHASED_TWINS = """name: "n"
layer {
  name: "data"
  type: "Input"
  top: "data"
  input_param { shape { dim: 1 dim: 2 } }
}
layer {
  name: "fc"
  type: "InnerProduct"
  bottom: "%s"
  top: "fc"
  inner_product_param { num_output: 3 }
  include { phase: TRAIN }
}
layer {
  name: "fc"
  type: "InnerProduct"
  bottom: "%s"
  top: "fc"
  inner_product_param { num_output: 3 }
  include { phase: TEST }
}
"""


def test_an_error_in_one_of_two_layers_of_a_name_names_that_layers_line(tmp_path):
    """A train_val file has a TRAIN and a TEST layer of one name (BVLC's
    cifar10_full_train_test.prototxt: two 'cifar' Data layers, lines 2 and 16): an error about
    the TEST one names its block, not the first block of that name (the sweep of
    tests/test_caffe_zoo12.py found the TEST Data layer's missing source reported at line 2);
    with a legacy ``input:`` (upgraded to an Input layer before the file's blocks) too."""
    path = tmp_path / "train_val.prototxt"
    path.write_text(PHASED_TWINS % ("data", "dta"))
    with pytest.raises(ValueError, match=r"train_val\.prototxt:16: .*layer 'fc': unknown "
                                         r"bottom blob 'dta'"):
        Net(str(path), caffe.TEST)
    assert Net(str(path), caffe.TRAIN).blobs["fc"].data.shape == (1, 3)
    path.write_text(PHASED_TWINS % ("dta", "data"))
    with pytest.raises(ValueError, match=r"train_val\.prototxt:8: .*layer 'fc': unknown bottom"):
        Net(str(path), caffe.TRAIN)
    legacy = PHASED_TWINS.replace(PHASED_TWINS[10:PHASED_TWINS.index("layer {\n  name: \"fc\"")],
                                  'input: "data"\ninput_dim: 1\ninput_dim: 2\ninput_dim: 1\ninput_dim: 1\n')
    path.write_text(legacy % ("data", "dta"))
    with pytest.raises(ValueError, match=r"train_val\.prototxt:15: .*layer 'fc': unknown bottom"):
        Net(str(path), caffe.TEST)


def test_unknown_type_lists_known_types():
    with pytest.raises(ValueError) as e:
        Net(net_param('layer { name: "x" type: "Convolutoin" top: "x" }'), caffe.TEST)
    assert "Convolution" in str(e.value) and "'x'" in str(e.value)
    assert str(e.value).endswith("; did you mean 'Convolution'?")    # a typo: the closest type
    with pytest.raises(ValueError, match=r"did you mean 'ReLU'\?$"):
        Net(net_param('layer { name: "x" type: "relu" top: "x" }'), caffe.TEST)


FORK_NET = """name: "fork"
layer {
  name: "data"
  type: "Input"
  top: "data"
  input_param { shape { dim: 1 dim: 4 dim: 6 dim: 6 } }
}
# a layer only a Caffe fork has, with no parameter block of its own
layer { name: "mix" type: "ChannelMixer" bottom: "data" top: "mix" }
"""


def test_unknown_type_in_a_file_names_its_line(tmp_path):
    """A fork's layer type (no BVLC layer implements it): the error gives file, line, layer
    and type, and lists the known types."""
    path = tmp_path / "fork.prototxt"
    path.write_text(FORK_NET)
    with pytest.raises(ValueError) as e:
        Net(str(path), caffe.TEST)
    msg = str(e.value)
    assert msg.startswith(f"{path}:9: layer 'mix': unknown layer type 'ChannelMixer'")
    assert "known types: AbsVal" in msg
    # a net given as a NetParameter has no file: the message is as before
    with pytest.raises(ValueError, match=r"^layer 'mix': unknown layer type"):
        Net(net_param(FORK_NET), caffe.TEST)
    # ... unless it says which file it came from (a solver's net: file)
    with pytest.raises(ValueError, match=rf"^{path}:9: layer 'mix': unknown layer type"):
        Net(net_param(FORK_NET), caffe.TEST, source=str(path))


def test_a_solvers_net_file_errors_name_the_file_and_line(tmp_path):
    """minicaffe train --solver S: a mistake in S's net: file names that file and the line
    of the layer, as Net(path) does (the solver used to set the source after the build)."""
    net = FORK_NET.replace('type: "ChannelMixer" bottom: "data"', 'type: "ReLU" bottom: "dat"')
    (tmp_path / "net.prototxt").write_text(net)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt"\nbase_lr: 0.1\nlr_policy: "fixed"\nsolver_mode: CPU\n')
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'net.prototxt'}:9: .*layer 'mix': "
                                         r"unknown bottom blob 'dat'"):
        caffe.get_solver(str(tmp_path / "solver.prototxt"))


def test_prototxt_error_has_file_line_column(tmp_path):
    f = tmp_path / "bad.prototxt"
    f.write_text('name: "x"\nlayer {\n  name: "a"\n  typo: "ReLU"\n}\n')
    with pytest.raises(ValueError) as e:
        Net(str(f), caffe.TEST)
    assert "bad.prototxt:4:" in str(e.value)


def test_caffemodel_round_trip(tmp_path):
    a = Net(net_param(MLP), caffe.TRAIN)
    path = tmp_path / "m.caffemodel"
    a.save(str(path))
    b = Net(net_param(MLP), caffe.TEST, weights=str(path))
    for name in a.params:
        for pa, pb in zip(a.params[name], b.params[name]):
            np.testing.assert_array_equal(pa.data, pb.data)
    # the file is a NetParameter that real Caffe reads: layer names, types and blob shapes
    proto = caffe_pb2.NetParameter.FromString(path.read_bytes())
    ip1 = [l for l in proto.layer if l.name == "ip1"][0]
    assert ip1.type == "InnerProduct" and list(ip1.blobs[0].shape.dim) == [5, 3]


def test_copy_from_shape_mismatch_names_layer(tmp_path):
    a = Net(net_param(MLP), caffe.TRAIN)
    path = tmp_path / "m.caffemodel"
    a.save(str(path))
    other = MLP.replace("num_output: 5", "num_output: 6")
    with pytest.raises(ValueError, match="layer 'ip1'.*rename the layer"):
        Net(net_param(other), caffe.TRAIN, weights=str(path))


def test_a_source_layer_without_blobs_for_a_layer_with_params_is_incompatible(tmp_path):
    """Caffe's CopyTrainedLayersFrom checks the blob count of every source layer whose name
    the net has, an empty one included (a model saved without that layer's weights)."""
    a = Net(net_param(MLP), caffe.TRAIN)
    path = tmp_path / "m.caffemodel"
    a.save(str(path))
    proto = caffe_pb2.NetParameter.FromString(path.read_bytes())
    for lp in proto.layer:
        if lp.name == "ip1":
            del lp.blobs[:]
    path.write_bytes(proto.SerializeToString())
    with pytest.raises(ValueError, match="incompatible number of blobs for layer 'ip1': "
                                         "source has 0, target 2"):
        Net(net_param(MLP), caffe.TRAIN, weights=str(path))


def test_network_file_is_pycaffes_keyword_for_the_net(tmp_path):
    f = tmp_path / "mlp.prototxt"
    f.write_text(MLP)
    net = Net(network_file=str(f), phase=caffe.TEST)
    assert net.phase == caffe.TEST and "ip1" in net.params
    with pytest.raises(TypeError, match="given twice"):
        Net(str(f), caffe.TEST, network_file=str(f))
    with pytest.raises(TypeError, match="needs the net"):
        Net(phase=caffe.TEST)


def test_legacy_input_fields():
    p = net_param("""
    name: "legacy" input: "data" input_dim: 2 input_dim: 3 input_dim: 4 input_dim: 5
    layer { name: "r" type: "ReLU" bottom: "data" top: "r" }
    """)
    net = Net(p, caffe.TEST)
    assert net.blobs["data"].shape == (2, 3, 4, 5)
    assert net.inputs == ["data"]
    assert net.outputs == ["r"]


def test_pycaffe_style_old_signature(tmp_path):
    a = Net(net_param(MLP), caffe.TRAIN)
    w = tmp_path / "m.caffemodel"
    a.save(str(w))
    f = tmp_path / "mlp.prototxt"
    f.write_text(MLP)
    b = caffe.Net(str(f), str(w), caffe.TEST)
    assert b.phase == caffe.TEST
    np.testing.assert_array_equal(a.params["ip2"][0].data, b.params["ip2"][0].data)


def test_param_blobs_written_in_the_net_definition_are_the_layers_starting_values(tmp_path):
    """Caffe's Layer constructor copies LayerParameter.blobs into blobs_ and every layer's
    LayerSetUp then skips its fillers ("Skipping parameter initialization"), so a net built
    from a NetParameter that carries weights (as Net::ToProto writes one, or a layer written
    with blobs { } in the prototxt) starts from them.  minicaffe ignored them and drew the
    fillers."""
    trained = Net(net_param(MLP), caffe.TRAIN)
    for i, blobs in enumerate(trained.params.values()):
        for b in blobs:
            b.data[...] = np.arange(b.count).reshape(b.shape) * 0.01 + i
    with_weights = trained.to_proto()
    assert len(with_weights.layer[1].blobs) == 2
    rebuilt = Net(with_weights, caffe.TRAIN)
    for name, blobs in trained.params.items():
        for a, b in zip(blobs, rebuilt.params[name]):
            np.testing.assert_array_equal(a.data, b.data, err_msg=name)

    text = MLP.replace('inner_product_param { num_output: 3',
                       'blobs { shape { dim: 3 dim: 5 } data: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, '
                       '11, 12, 13, 14, 15] } blobs { num: 1 channels: 1 height: 1 width: 3 '
                       'data: [7, 8, 9] } inner_product_param { num_output: 3')
    net = Net(net_param(text), caffe.TEST)
    np.testing.assert_array_equal(net.params["ip2"][0].data, np.arange(1, 16).reshape(3, 5))
    np.testing.assert_array_equal(net.params["ip2"][1].data, [7, 8, 9])   # legacy 4-d shape

    wrong = MLP.replace('inner_product_param { num_output: 3',
                        'blobs { shape { dim: 3 dim: 5 } } inner_product_param { num_output: 3')
    with pytest.raises(ValueError, match=r"'ip2'.*gives 1 param blob\(s\).*has 2"):
        Net(net_param(wrong), caffe.TEST)
    # a layer without params of its own keeps them as params, as Caffe's blobs_ does
    extra = MLP.replace('layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }',
                        'layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" '
                        'blobs { shape { dim: 2 } data: [5, 6] } }')
    net = Net(net_param(extra), caffe.TEST)
    np.testing.assert_array_equal(net.params["relu1"][0].data, [5, 6])
