"""Net behaviour checked against BVLC Caffe's own unit tests for the net level.

Mirrors src/caffe/test/test_net.cpp (NetTest, FilterNetTest) and the InsertSplits cases of
src/caffe/test/test_split_layer.cpp (SplitLayerInsertionTest).  The prototxt inputs and the
expected outputs are Caffe's; each test states what Caffe asserts about them.
"""
import numpy as np
import pytest

from minicaffe.net import TRAIN, TEST, Net, filter_net, insert_splits
from minicaffe.proto import caffe_pb2, parse_text, upgrade_net
from minicaffe.rng import set_random_seed

SEED = 1701


def P(text):
    return parse_text(text, caffe_pb2.NetParameter, filename="<caffe test net>")


def make(text, phase=TEST, **kw):
    return Net(P(text), phase, dtype=np.float64, **kw)


IP_PARAMS = ("param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }")
FILLERS = ("weight_filler { type: 'gaussian' std: 0.01 } "
           "bias_filler { type: 'constant' value: 0 }")


def tiny_net(force_backward=False, accuracy=False):
    text = f"""name: 'TinyTestNetwork'
    layer {{ name: 'data' type: 'DummyData'
      dummy_data_param {{ shape {{ dim: 5 dim: 2 dim: 3 dim: 4 }}
                          data_filler {{ type: 'gaussian' std: 0.01 }}
                          shape {{ dim: 5 }} data_filler {{ type: 'constant' value: 0 }} }}
      top: 'data' top: 'label' }}
    layer {{ name: 'innerproduct' type: 'InnerProduct'
      inner_product_param {{ num_output: 1000 {FILLERS} }} {IP_PARAMS}
      bottom: 'data' top: 'innerproduct' }}
    layer {{ name: 'loss' type: 'SoftmaxWithLoss' bottom: 'innerproduct' bottom: 'label'
      top: 'top_loss' }}
    """
    if accuracy:
        text += ("layer { name: 'loss' type: 'Accuracy' bottom: 'innerproduct' "
                 "bottom: 'label' top: 'accuracy' }")
    if force_backward:
        text += " force_backward: true"
    return text


def tiny_net_euclidean(force_backward=False):
    text = f"""name: 'TinyTestEuclidLossNetwork'
    layer {{ name: 'data' type: 'DummyData'
      dummy_data_param {{ num: 5 channels: 2 height: 3 width: 4
                          num: 5 channels: 1 height: 1 width: 1
                          data_filler {{ type: 'gaussian' std: 0.01 }} }}
      top: 'data' top: 'label' }}
    layer {{ name: 'innerproduct' type: 'InnerProduct'
      inner_product_param {{ num_output: 1 {FILLERS} }} {IP_PARAMS}
      bottom: 'data' top: 'innerproduct' }}
    layer {{ name: 'loss' type: 'EuclideanLoss' bottom: 'innerproduct' bottom: 'label' }}
    """
    return text + (" force_backward: true" if force_backward else "")


def tricky_net(loss_weight=None):
    lw = f"loss_weight: {loss_weight}" if loss_weight is not None else ""
    return f"""name: 'TrickyTestNetwork'
    layer {{ name: 'data' type: 'DummyData'
      dummy_data_param {{ num: 5 channels: 2 height: 3 width: 4
                          num: 5 channels: 1 height: 1 width: 1
                          data_filler {{ type: 'gaussian' std: 0.01 }} }}
      top: 'data' top: 'label' }}
    layer {{ name: 'innerproduct' type: 'InnerProduct'
      inner_product_param {{ num_output: 1000 {FILLERS} }} {IP_PARAMS}
      bottom: 'data' top: 'transformed_data' }}
    layer {{ name: 'innerproduct' type: 'InnerProduct'
      inner_product_param {{ num_output: 1 {FILLERS} }} {IP_PARAMS}
      bottom: 'label' top: 'transformed_label' }}
    layer {{ name: 'loss' type: 'SoftmaxWithLoss' {lw}
      bottom: 'transformed_data' bottom: 'transformed_label' }}
    """


def unshared_weights_net(loss_weight=None, midnet_loss_weight=None, force_backward=False,
                         bias_term=False, lr_w1=1, lr_b1=2, lr_w2=1, lr_b2=2):
    bias = "true" if bias_term else "false"
    text = "name: 'UnsharedWeightsNetwork' "
    if force_backward:
        text += "force_backward: true "
    text += """layer { name: 'data' type: 'DummyData'
      dummy_data_param { num: 5 channels: 2 height: 3 width: 4
                         data_filler { type: 'gaussian' std: 0.01 } }
      top: 'data' } """
    for i, (lw_, lb) in ((1, (lr_w1, lr_b1)), (2, (lr_w2, lr_b2))):
        text += f"""layer {{ name: 'innerproduct{i}' type: 'InnerProduct'
          inner_product_param {{ num_output: 10 bias_term: {bias}
                                 weight_filler {{ type: 'gaussian' std: 10 }} }}
          param {{ name: 'unsharedweights{i}' lr_mult: {lw_} }} """
        if bias_term:
            text += f"param {{ lr_mult: {lb} }} "
        text += f"bottom: 'data' top: 'innerproduct{i}' "
        if i == 1 and midnet_loss_weight is not None:
            text += f"loss_weight: {midnet_loss_weight} "
        text += "} "
    text += "layer { name: 'loss' type: 'EuclideanLoss' "
    if loss_weight is not None:
        text += f"loss_weight: {loss_weight} "
    return text + "bottom: 'innerproduct1' bottom: 'innerproduct2' }"


def two_ip_net(name, shared, chained=False):
    """Caffe's SharedWeightsNetwork (shared=True) and the DiffData(Un)SharedWeights nets
    (chained=True: ip2 reads ip1, constant 0.5 weights, gaussian data of std 10)."""
    pname = ("sharedweights", "sharedweights") if shared else (
        "unsharedweights1", "unsharedweights2")
    if chained:
        data = """layer { name: 'data' type: 'DummyData'
          dummy_data_param { num: 10 channels: 10 height: 1 width: 1
                             num: 10 channels: 10 height: 1 width: 1
                             data_filler { type: 'gaussian' std: 10 } }
          top: 'data1' top: 'data2' } """
        filler = "weight_filler { type: 'constant' value: 0.5 }"
        bottoms = ("data1", "innerproduct1")
        loss = "bottom: 'data2' bottom: 'innerproduct2'"
    else:
        data = """layer { name: 'data' type: 'DummyData'
          dummy_data_param { num: 5 channels: 2 height: 3 width: 4
                             data_filler { type: 'gaussian' std: 0.01 } }
          top: 'data' } """
        filler = "weight_filler { type: 'gaussian' std: 10 }"
        bottoms = ("data", "data")
        loss = "bottom: 'innerproduct1' bottom: 'innerproduct2'"
    text = f"name: '{name}' " + data
    for i in (1, 2):
        text += f"""layer {{ name: 'innerproduct{i}' type: 'InnerProduct'
          inner_product_param {{ num_output: 10 bias_term: false {filler} }}
          param {{ name: '{pname[i - 1]}' }} bottom: '{bottoms[i - 1]}' top: 'innerproduct{i}' }} """
    return text + f"layer {{ name: 'loss' type: 'EuclideanLoss' {loss} }}"


# ------------------------------------------------------------ blobs, layers
def test_has_blob_get_blob_has_layer():
    """TestHasBlob / TestGetBlob / TestHasLayer / TestGetLayerByName."""
    net = make(tiny_net())
    assert list(net.blobs) == ["data", "label", "innerproduct", "top_loss"]
    assert "loss" not in net.blobs
    assert net.layer_names == ["data", "innerproduct", "loss"]
    assert net.layer_dict["loss"] is net.layers[2]
    assert "label" not in net.layer_dict


# ------------------------------------------------------- backward needs
def test_bottom_need_backward():
    """TestBottomNeedBackward: data gets no diff; the label gets none either."""
    assert make(tiny_net()).bottom_need_backward == [[], [False], [True, False]]


def test_bottom_need_backward_force():
    """TestBottomNeedBackwardForce: force_backward reaches the data, never the label of
    SoftmaxWithLoss (its AllowForceBackward(1) is false)."""
    assert make(tiny_net(force_backward=True)).bottom_need_backward == [
        [], [True], [True, False]]


def test_bottom_need_backward_euclidean_force():
    """TestBottomNeedBackwardEuclideanForce: EuclideanLoss allows force_backward on both."""
    net = make(tiny_net_euclidean(force_backward=True))
    assert net.bottom_need_backward == [[], [True], [True, True]]


def test_bottom_need_backward_tricky():
    """TestBottomNeedBackwardTricky: the label of the softmax loss has weights under it, so
    Caffe says it needs backward."""
    net = make(tricky_net())
    assert net.bottom_need_backward == [[], [False], [False], [True, True]]


@pytest.mark.parametrize("bn_params, needs", [("", True),
                                               ("param { lr_mult: 0 } " * 3, False)])
def test_batch_norm_on_the_data_needs_backward_unless_its_file_says_lr_mult_0(
        bn_params, needs, tmp_path):
    """Net::Init decides need_backward from the file's ParamSpecs (a missing one has
    lr_mult 1), while BatchNormLayer::LayerSetUp gives its statistics lr_mult 0 in its own
    copy of the LayerParameter only (which AppendParam, and so the solver, reads).  So a
    BatchNorm on the data written without ``param`` needs backward, its top does too, and
    its Backward_cpu, which never reads propagate_down, writes the data's diff: the
    gradient that force_backward gives.  Written with the old three ``param { lr_mult: 0 }``
    (UpgradeNetBatchNorm keeps them, at lr_mult 0) it needs none."""
    text = f"""name: 'BNOnData'
    layer {{ name: 'data' type: 'DummyData'
      dummy_data_param {{ shape {{ dim: 4 dim: 3 }} data_filler {{ type: 'gaussian' }}
                          shape {{ dim: 4 }} data_filler {{ type: 'constant' value: 1 }} }}
      top: 'data' top: 'label' }}
    layer {{ name: 'bn' type: 'BatchNorm' bottom: 'data' top: 'bn' {bn_params}}}
    layer {{ name: 'loss' type: 'SoftmaxWithLoss' bottom: 'bn' bottom: 'label' top: 'loss' }}
    """
    path = tmp_path / "net.prototxt"         # read from a file: upgraded, as Caffe does
    path.write_text(text)
    net = Net(str(path), TRAIN, dtype=np.float64)
    assert net.layer_need_backward == [False, needs, needs]
    assert net.bottom_need_backward == [[], [False], [needs, False]]
    assert net.blob_need_backward["bn"] == needs
    assert [p.lr_mult for p in net.param_specs[1]] == [0, 0, 0]     # the solver's
    path.write_text(text.replace("name: 'BNOnData'", "name: 'BNOnData' force_backward: true"))
    forced = Net(str(path), TRAIN, dtype=np.float64)
    for n in (net, forced):
        n.blobs["data"].data[...] = np.linspace(-1, 2, 12).reshape(4, 3)
        n.forward(start="bn")
        n.backward()
    assert np.abs(forced.blobs["data"].diff).max() > 0
    if needs:
        np.testing.assert_array_equal(net.blobs["bn"].diff, forced.blobs["bn"].diff)
        np.testing.assert_array_equal(net.blobs["data"].diff, forced.blobs["data"].diff)
    else:
        assert not np.any(net.blobs["data"].diff)


def test_loss_layer_without_top_gets_an_automatic_top():
    """A loss layer written without a top (TinyTestEuclidLossNetwork, and many V1 model-zoo
    train_val files) gets an anonymous top, as net.cpp's AutoTopBlobs does: its loss counts,
    it is no net output."""
    set_random_seed(SEED)
    net = make(tiny_net_euclidean(), TRAIN)
    assert net.layer_top_names[2] == ["(automatic)"]
    assert net.outputs == []          # innerproduct and label are read by the loss
    assert net.layers[2].loss_weight(0) == 1.0
    loss = float(net.forward_backward())
    manual = np.sum((np.asarray(net.blobs["innerproduct"].data).ravel()
                     - np.asarray(net.blobs["label"].data).ravel()) ** 2) / 2 / 5
    assert loss == pytest.approx(manual) and loss > 0


# ---------------------------------------------------------------- loss weights
def _forward_backward(text):
    set_random_seed(SEED)
    net = make(text, TRAIN)
    loss = float(net.forward_backward())
    blobs = {n: np.array(b.diff) for n, b in net.blobs.items()}
    params = [np.array(p.diff) for p in net.learnable_params]
    return net, loss, blobs, params


@pytest.mark.parametrize("w", [2, 0, 1, -1, -2.5, 3.7])
def test_loss_weight(w):
    """TestLossWeight: scaling the loss weight scales the loss, every blob diff and every
    param diff (an unspecified loss_weight of EuclideanLoss is 1)."""
    _, loss, blobs, params = _forward_backward(unshared_weights_net(force_backward=True))
    assert abs(loss) >= 1e-2
    _, wloss, wblobs, wparams = _forward_backward(
        unshared_weights_net(loss_weight=w, force_backward=True))
    margin = 1e-4 * abs(w) + 1e-12
    assert wloss == pytest.approx(loss * w, abs=margin)
    assert list(wblobs) == list(blobs)
    for name in blobs:
        np.testing.assert_allclose(wblobs[name], blobs[name] * w, atol=margin, err_msg=name)
    for a, b in zip(wparams, params):
        np.testing.assert_allclose(a, b * w, atol=margin)


@pytest.mark.parametrize("w", [2, 0, 1, -1, -2.5, 3.7])
def test_loss_weight_mid_net(w):
    """TestLossWeightMidNet: a loss_weight on an InnerProduct top makes it a loss; the data
    diff scales with it."""
    _, loss, blobs, _ = _forward_backward(unshared_weights_net(0, 1, force_backward=True))
    assert abs(loss) >= 1e-2
    _, wloss, wblobs, _ = _forward_backward(unshared_weights_net(0, w, force_backward=True))
    margin = 1e-4 * abs(w) + 1e-12
    assert wloss == pytest.approx(loss * w, abs=margin)
    np.testing.assert_allclose(wblobs["data"], blobs["data"] * w, atol=margin)


def test_combo_loss_weight():
    """TestComboLossWeight: with the mid-net loss and the final loss, the diffs are affine in
    each weight; the split top feeding only the mid-net loss does not change with the final
    loss weight, and only the blobs under the mid-net loss change with the mid-net weight."""
    _, loss, base, _ = _forward_backward(unshared_weights_net(1, 1, force_backward=True))
    assert "innerproduct1_innerproduct1_0_split_0" in base
    assert "data_data_0_split_0" in base
    _, loss2, g2, _ = _forward_backward(unshared_weights_net(2, 1, force_backward=True))
    _, loss3, g3, _ = _forward_backward(unshared_weights_net(3, 1, force_backward=True))
    for name in base:
        d2, d3 = g2[name] - base[name], g3[name] - base[name]
        if name == "innerproduct1_innerproduct1_0_split_0":
            assert not d2.any() and not d3.any(), name
        else:
            assert (np.abs(d2) > 1e-4).all(), name
            np.testing.assert_allclose(2 * d2, d3, atol=1e-4, err_msg=name)
    assert abs(loss2 - loss) > 1e-4
    assert 2 * (loss2 - loss) == pytest.approx(loss3 - loss, abs=1e-4)

    _, mloss2, m2, _ = _forward_backward(unshared_weights_net(1, 2, force_backward=True))
    _, mloss3, m3, _ = _forward_backward(unshared_weights_net(1, 3, force_backward=True))
    changing = {"innerproduct1", "innerproduct1_innerproduct1_0_split_0",
                "data_data_0_split_0", "data"}
    for name in base:
        d2, d3 = m2[name] - base[name], m3[name] - base[name]
        if name in changing:
            assert (np.abs(d2) > 1e-4).all(), name
            np.testing.assert_allclose(2 * d2, d3, atol=1e-4, err_msg=name)
        else:
            assert not d2.any() and not d3.any(), name
    assert abs(mloss2 - loss) > 1e-4
    assert 2 * (mloss2 - loss) == pytest.approx(mloss3 - loss, abs=1e-4)


def test_backward_with_accuracy_layer():
    """TestBackwardWithAccuracyLayer: backward runs although an Accuracy layer reads the
    label and the scores."""
    net = make(tiny_net(accuracy=True), TRAIN)
    assert "accuracy" in net.blobs
    net.forward_backward()


# ------------------------------------------------------------ shared weights
def test_unshared_weights_data_net():
    """TestUnsharedWeightsDataNet: two different weights give a positive loss."""
    set_random_seed(SEED)
    net = make(unshared_weights_net())
    assert float(net.forward_from_to()) > 0


def test_shared_weights_data_net():
    """TestSharedWeightsDataNet: the same weight on the same data gives a zero loss."""
    set_random_seed(SEED)
    net = make(two_ip_net("SharedWeightsNetwork", shared=True))
    assert float(net.forward_from_to()) == pytest.approx(0.0)


def test_unshared_weights_diff_net():
    """TestUnsharedWeightsDiffNet: the two weight diffs are opposite and non-zero."""
    set_random_seed(SEED)
    net = make(unshared_weights_net(), TRAIN)
    net.forward_backward()
    g1 = np.asarray(net.params["innerproduct1"][0].diff)
    g2 = np.asarray(net.params["innerproduct2"][0].diff)
    assert (np.abs(g1) > 0).all()
    np.testing.assert_allclose(-g1, g2, rtol=1e-6)


def test_shared_weights_diff_net():
    """TestSharedWeightsDiffNet: shared weights give a zero loss and a zero diff."""
    set_random_seed(SEED)
    net = make(two_ip_net("SharedWeightsNetwork", shared=True), TRAIN)
    assert float(net.forward_backward()) == pytest.approx(0.0)
    for name in ("innerproduct1", "innerproduct2"):
        np.testing.assert_allclose(np.asarray(net.params[name][0].diff), 0.0, atol=1e-12)


def test_shared_weights_update():
    """TestSharedWeightsUpdate: shared weights share data and diff memory; the diff of the
    shared weight is the sum of the diffs the two unshared weights get; an update (data -=
    diff, Net::Update) moves both layers' weight."""
    set_random_seed(SEED)
    net = make(two_ip_net("DiffDataSharedWeightsNetwork", shared=True, chained=True), TRAIN)
    assert net.layer_names[1:3] == ["innerproduct1", "innerproduct2"]
    w1, w2 = net.layers[1].blobs[0], net.layers[2].blobs[0]
    assert np.shares_memory(w1.data, w2.data) and np.shares_memory(w1.diff, w2.diff)
    assert len(net.learnable_params) == 1
    net.forward_backward()
    shared_diff = np.array(w1.diff)
    assert (shared_diff != 0).all()
    expected = np.array(w1.data) - shared_diff
    for p in net.learnable_params:   # Net::Update
        p.data[...] -= p.diff
    np.testing.assert_array_equal(np.asarray(w2.data), expected)

    set_random_seed(SEED)
    net = make(two_ip_net("DiffDataUnsharedWeightsNetwork", shared=False, chained=True), TRAIN)
    u1, u2 = net.layers[1].blobs[0], net.layers[2].blobs[0]
    assert not np.shares_memory(u1.data, u2.data) and not np.shares_memory(u1.diff, u2.diff)
    net.forward_backward()
    d1, d2 = np.asarray(u1.diff), np.asarray(u2.diff)
    assert (d1 != 0).all() and (d2 != 0).all() and (d1 != d2).all()
    np.testing.assert_allclose(d1 + d2, shared_diff, rtol=1e-6)


def test_shared_weights_resume():
    """TestSharedWeightsResume: weights saved with ToProto and copied back by layer name
    into a fresh net keep being shared (same data and diff memory)."""
    set_random_seed(SEED)
    text = two_ip_net("DiffDataSharedWeightsNetwork", shared=True, chained=True)
    net = make(text, TRAIN)
    net.forward_backward()
    for p in net.learnable_params:
        p.data[...] -= p.diff
    saved = np.array(net.layers[1].blobs[0].data)
    proto = net.to_proto()
    set_random_seed(SEED)
    net = make(text, TRAIN)
    net.copy_from(proto)
    w1, w2 = net.layers[1].blobs[0], net.layers[2].blobs[0]
    assert w1 is not w2
    assert np.shares_memory(w1.data, w2.data) and np.shares_memory(w1.diff, w2.diff)
    # a float64 net writes double_data, as Caffe's Blob<double>::ToProto: exact round trip
    np.testing.assert_array_equal(np.asarray(w1.data), saved)


def _shared_pair(mode, shape2, lr1="", lr2="", decay1="", decay2=""):
    return f"""name: 'share'
    layer {{ name: 'data' type: 'Input' top: 'a' top: 'b'
      input_param {{ shape {{ dim: 2 dim: 6 }} shape {{ dim: 2 dim: {shape2} }} }} }}
    layer {{ name: 'ip1' type: 'InnerProduct' bottom: 'a' top: 'x'
      param {{ name: 'w' {lr1} {decay1} }}
      inner_product_param {{ num_output: 4 bias_term: false }} }}
    layer {{ name: 'ip2' type: 'InnerProduct' bottom: 'b' top: 'y'
      param {{ name: 'w' {mode} {lr2} {decay2} }}
      inner_product_param {{ num_output: {24 // shape2} bias_term: false }} }}
    """


def test_share_mode_strict_and_permissive():
    """Net::AppendParam: STRICT (the default) needs the same shape, PERMISSIVE only the same
    count; the error names both layers."""
    make(_shared_pair("", 6))
    make(_shared_pair("share_mode: PERMISSIVE", 3))      # (8, 3) shares the (4, 6) weight
    with pytest.raises(ValueError, match=r"'w' owned by layer 'ip1' with layer 'ip2'"):
        make(_shared_pair("", 3))
    with pytest.raises(ValueError, match="'ip2'"):
        make(_shared_pair("share_mode: STRICT", 3))
    with pytest.raises(ValueError, match="count"):
        make(_shared_pair("share_mode: PERMISSIVE", 5))  # (4, 5): 20 values, not 24


def test_shared_param_takes_the_first_explicit_lr_and_decay_mult():
    """Net::AppendParam: a shared param's lr_mult (decay_mult) is the first one given
    explicitly by its owner or a sharer; a later explicit one must agree."""
    net = make(_shared_pair("", 6, lr2="lr_mult: 0", decay2="decay_mult: 3"))
    assert net.param_lr_mult == [0.0] and net.param_decay_mult == [3.0]
    net = make(_shared_pair("", 6, lr1="lr_mult: 2", lr2="lr_mult: 2"))
    assert net.param_lr_mult == [2.0] and net.param_decay_mult == [1.0]
    with pytest.raises(ValueError, match="lr_mult"):
        make(_shared_pair("", 6, lr1="lr_mult: 2", lr2="lr_mult: 1"))
    with pytest.raises(ValueError, match="decay_mult"):
        make(_shared_pair("", 6, decay1="decay_mult: 2", decay2="decay_mult: 1"))


# ------------------------------------------------------ param propagate down
def test_param_propagate_down():
    """TestParamPropagateDown: lr_mult changes do not change the gradients; a zero lr_mult
    gives a zero gradient for that param only."""
    def asums(**lr):
        set_random_seed(SEED)
        net = make(unshared_weights_net(bias_term=True, **lr), TRAIN)
        net.forward_backward()
        assert len(net.learnable_params) == 4
        return [float(np.abs(np.asarray(p.diff)).sum()) for p in net.learnable_params]

    base = asums(lr_w1=1, lr_w2=1, lr_b1=2, lr_b2=2)
    assert all(a > 1e-3 for a in base)
    assert asums(lr_w1=2, lr_w2=2, lr_b1=4, lr_b2=4) == pytest.approx(base)
    got = asums(lr_w1=1, lr_w2=0, lr_b1=0, lr_b2=1)   # params: w1 b1 w2 b2
    assert got == pytest.approx([base[0], 0, 0, base[3]])
    got = asums(lr_w1=0, lr_w2=1, lr_b1=1, lr_b2=0)
    assert got == pytest.approx([0, base[1], base[2], 0])


def test_from_to():
    """TestFromTo: partial forwards and backwards give the full pass's loss and data diff."""
    set_random_seed(SEED)
    net = make(tiny_net(force_backward=True), TRAIN)
    net.forward_from_to()
    net.backward_from_to()
    data_diff = np.array(net.blobs["data"].diff)
    loss = float(np.asarray(net.blobs["top_loss"].data))
    n = len(net.layers)
    for i in range(1, n):
        net.forward_from_to(1, 1)
        if i < n - 1:
            net.forward_from_to(i + 1)
        assert float(np.asarray(net.blobs["top_loss"].data)) == loss
    for i in range(1, n):
        net.backward_from_to(end=i)
        net.backward_from_to(start=i - 1)
        np.testing.assert_array_equal(np.asarray(net.blobs["data"].diff), data_diff)


RESHAPABLE = """name: 'ReshapableNetwork'
input: 'data' input_dim: 1 input_dim: 3 input_dim: 100 input_dim: 100
layer { name: 'conv1' type: 'Convolution' bottom: 'data' top: 'conv1'
  convolution_param { num_output: 5 kernel_size: 3 stride: 2
    weight_filler { type: 'gaussian' std: 0.01 } bias_filler { type: 'constant' value: 0.2 } } }
layer { name: 'relu1' type: 'ReLU' bottom: 'conv1' top: 'conv1' }
layer { name: 'pool1' type: 'Pooling' bottom: 'conv1' top: 'pool1'
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: 'norm1' type: 'LRN' bottom: 'pool1' top: 'norm1' lrn_param { local_size: 3 } }
layer { name: 'softmax' type: 'Softmax' bottom: 'norm1' top: 'softmax' }
"""


def test_reshape():
    """TestReshape: switching the input between two shapes gives the same outputs each time,
    and the output shapes follow the input."""
    set_random_seed(SEED)
    rng = np.random.default_rng(SEED)
    x1, x2 = rng.standard_normal((2, 3, 12, 10)), rng.standard_normal((4, 3, 9, 11))
    net = make(RESHAPABLE)
    outs = []
    for x in (x1, x2, x1, x2):
        net.blobs["data"].reshape(*x.shape)
        net.blobs["data"].data[...] = x
        net.forward_from_to()
        net.backward_from_to()
        outs.append(np.array(net.blobs["softmax"].data))
    np.testing.assert_allclose(outs[2], outs[0], rtol=1e-6)
    np.testing.assert_allclose(outs[3], outs[1], rtol=1e-6)
    assert outs[0].shape[0] == 2 and outs[1].shape[0] == 4
    assert outs[0].shape[2:] != outs[1].shape[2:]


def skip_prop_net(skip):
    pd = "propagate_down: true propagate_down: false" if skip else (
        "propagate_down: true propagate_down: true")
    return f"""name: 'SkipPropTestNetwork'
    layer {{ name: 'data' type: 'DummyData'
      dummy_data_param {{ shape {{ dim: 5 dim: 2 dim: 3 dim: 4 }}
                          data_filler {{ type: 'gaussian' std: 0.01 }}
                          shape {{ dim: 5 }} data_filler {{ type: 'constant' value: 0 }} }}
      top: 'data' top: 'label' }}
    layer {{ name: 'silence' bottom: 'label' type: 'Silence' }}
    layer {{ name: 'innerproduct' type: 'InnerProduct'
      inner_product_param {{ num_output: 1 {FILLERS} }} {IP_PARAMS}
      bottom: 'data' top: 'innerproduct' }}
    layer {{ name: 'ip_fake_labels' type: 'InnerProduct'
      inner_product_param {{ num_output: 1 {FILLERS} }}
      bottom: 'data' top: 'fake_labels' }}
    layer {{ name: 'argmax' bottom: 'fake_labels' top: 'label_argmax' type: 'ArgMax' }}
    layer {{ name: 'loss' bottom: 'innerproduct' bottom: 'label_argmax' {pd}
      top: 'cross_entropy_loss' type: 'SigmoidCrossEntropyLoss' loss_weight: 0.1 }}
    """


def test_skip_propagate_down():
    """TestSkipPropagateDown: propagate_down true on the labels makes every layer above the
    data need backward; false leaves only innerproduct and loss."""
    net = make(skip_prop_net(skip=False), TRAIN)
    for li, name in enumerate(net.layer_names):
        if name == "loss":
            assert net.bottom_need_backward[li][1]
        expect = not ("data" in name or name == "silence")
        assert net.layer_need_backward[li] == expect, name
    net = make(skip_prop_net(skip=True), TRAIN)
    for li, name in enumerate(net.layer_names):
        if name == "loss":
            assert not net.bottom_need_backward[li][1]
        assert net.layer_need_backward[li] == (name in ("innerproduct", "loss")), name


def force_prop_net(force):
    pd = "propagate_down: true" if force else ""
    return f"""name: 'ForcePropTestNetwork'
    layer {{ name: 'data' type: 'DummyData'
      dummy_data_param {{ shape {{ dim: 5 dim: 2 dim: 3 dim: 4 }}
                          data_filler {{ type: 'gaussian' std: 0.01 }}
                          shape {{ dim: 5 }} data_filler {{ type: 'constant' value: 0 }} }}
      top: 'data' top: 'label' }}
    layer {{ name: 'innerproduct' type: 'InnerProduct'
      inner_product_param {{ num_output: 1 weight_filler {{ type: 'gaussian' std: 0.01 }} }}
      bottom: 'data' top: 'innerproduct' {pd} }}
    layer {{ name: 'loss' bottom: 'innerproduct' bottom: 'label'
      top: 'cross_entropy_loss' type: 'SigmoidCrossEntropyLoss' }}
    """


@pytest.mark.parametrize("force", [False, True])
def test_force_propagate_down(force):
    """TestForcePropagateDown: propagate_down: true on a layer reading the data makes the
    data need backward; without it the data gets no diff."""
    net = make(force_prop_net(force), TRAIN)
    by = dict(zip(net.layer_names, zip(net.bottom_need_backward, net.layer_need_backward)))
    assert by["data"] == ([], False)
    assert by["innerproduct"] == ([force], True)
    assert by["loss"] == ([True, False], True)


ALL_IN_ONE = """name: 'All-in-one Network'
layer { name: 'train-data' type: 'DummyData' top: 'data' top: 'label'
  dummy_data_param { shape { dim: 1 dim: 10 } shape { dim: 1 dim: 1 } }
  include { phase: TRAIN stage: 'train' } }
layer { name: 'val-data' type: 'DummyData' top: 'data' top: 'label'
  dummy_data_param { shape { dim: 1 dim: 10 } shape { dim: 1 dim: 1 } }
  include { phase: TEST stage: 'val' } }
layer { name: 'deploy-data' type: 'Input' top: 'data'
  input_param { shape { dim: 1 dim: 10 } } include { phase: TEST stage: 'deploy' } }
layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip'
  inner_product_param { num_output: 2 } }
layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss'
  include { phase: TRAIN stage: 'train' } include { phase: TEST stage: 'val' } }
"""


@pytest.mark.parametrize("phase, stage, layers", [
    (TRAIN, "train", ["train-data", "ip", "loss"]),
    (TEST, "val", ["val-data", "ip", "loss"]),
    (TEST, "deploy", ["deploy-data", "ip"]),
])
def test_all_in_one_net(phase, stage, layers):
    """TestAllInOneNetTrain / Val / Deploy: one file, three nets chosen by phase and stage."""
    assert make(ALL_IN_ONE, phase, stages=[stage]).layer_names == layers


# ----------------------------------------------------------------- FilterNet
BASE_LAYERS = ("layer { name: 'data' type: 'Data' top: 'data' top: 'label' %s} "
               "layer { name: 'innerprod' type: 'InnerProduct' bottom: 'data' "
               "top: 'innerprod' %s} "
               "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'innerprod' "
               "bottom: 'label' %s} ")


def three(state="", data="", ip="", loss="", keep=(True, True, True)):
    layers = BASE_LAYERS.split("layer {")[1:]
    rules = (data, ip, loss)
    text = (f"state: {{ {state} }} " if state else "") + "name: 'TestNetwork' "
    for k, (body, rule) in enumerate(zip(layers, rules)):
        if keep[k]:
            text += "layer {" + body % rule
    return text


FILTER_CASES = {
    "NoFilter": (three(), three()),
    "FilterOutByStage": (three(data="include: { stage: 'mystage' } "),
                         three(keep=(False, True, True))),
    "FilterOutByStage2": (three(ip="include: { stage: 'mystage' } "),
                          three(keep=(True, False, True))),
    "FilterInByStage": (three("stage: 'mystage'", ip="include: { stage: 'mystage' } "),) * 2,
    "FilterInByStage2": (three(ip="exclude: { stage: 'mystage' } "),) * 2,
    "FilterOutByMultipleStage": (
        three("stage: 'mystage'", ip="include: { stage: 'mystage' stage: 'myotherstage' } ",
              loss="include: { stage: 'mystage' } "),
        three("stage: 'mystage'", loss="include: { stage: 'mystage' } ",
              keep=(True, False, True))),
    "FilterInByMultipleStage": (
        three("stage: 'mystage'",
              ip="include: { stage: 'myotherstage' } include: { stage: 'mystage' } ",
              loss="include: { stage: 'mystage' } "),) * 2,
    "FilterInByMultipleStage2": (
        three("stage: 'mystage' stage: 'myotherstage'",
              ip="include: { stage: 'mystage' stage: 'myotherstage' } ",
              loss="include: { stage: 'mystage' } "),) * 2,
    "FilterInByNotStage": (
        three("stage: 'mystage'", ip="include: { not_stage: 'myotherstage' } ",
              loss="include: { not_stage: 'myotherstage' } "),) * 2,
    "FilterOutByNotStage": (
        three("stage: 'mystage'", ip="include: { not_stage: 'mystage' } ",
              loss="include: { not_stage: 'mystage' } "),
        three("stage: 'mystage'", keep=(True, False, False))),
    "FilterOutByMinLevel": (three(ip="include: { min_level: 3 } "),
                            three(keep=(True, False, True))),
    "FilterOutByMaxLevel": (three(ip="include: { max_level: -3 } "),
                            three(keep=(True, False, True))),
    "FilterInByMinLevel": (three(ip="include: { min_level: 0 } "),) * 2,
    "FilterInByMinLevel2": (three("level: 7", ip="include: { min_level: 3 } "),) * 2,
    "FilterInByMaxLevel": (three(ip="include: { max_level: 0 } "),) * 2,
    "FilterInByMaxLevel2": (three("level: -7", ip="include: { max_level: -3 } "),) * 2,
}
for _phase in ("TRAIN", "TEST"):
    _other = "TEST" if _phase == "TRAIN" else "TRAIN"
    _ip = "include: { min_level: 2  phase: TRAIN } "
    _loss = "include: { min_level: 2  phase: TEST } "
    FILTER_CASES[f"FilterInOutByIncludeMultiRule_{_phase}"] = (
        three(f"level: 4 phase: {_phase}", ip=_ip, loss=_loss),
        three(f"level: 4 phase: {_phase}", ip=_ip, loss=_loss,
              keep=(True, _phase == "TRAIN", _phase == "TEST")))
    FILTER_CASES[f"FilterInByIncludeMultiRule_{_phase}"] = (
        three(f"level: 2 phase: {_phase}",
              ip="include: { min_level: 2  phase: TRAIN } include: { phase: TEST } ",
              loss="include: { min_level: 2  phase: TEST } include: { phase: TRAIN } "),) * 2
    _ipx = "exclude: { min_level: 2  phase: TRAIN } "
    _lossx = "exclude: { min_level: 2  phase: TEST } "
    FILTER_CASES[f"FilterInOutByExcludeMultiRule_{_phase}"] = (
        three(f"level: 4 phase: {_phase}", ip=_ipx, loss=_lossx),
        three(f"level: 4 phase: {_phase}", ip=_ipx, loss=_lossx,
              keep=(True, _phase == "TEST", _phase == "TRAIN")))


@pytest.mark.parametrize("case", sorted(FILTER_CASES))
def test_filter_net(case):
    """FilterNetTest: Net::FilterNet under the net's own ``state`` gives Caffe's expected
    net, and filtering twice changes nothing."""
    given, expected = (P(t) for t in FILTER_CASES[case])
    out = filter_net(given, given.state)
    assert out == expected, case
    assert filter_net(out, out.state) == out


LENET_LAYERS = """
layer { name: 'mnist' type: 'Data' top: 'data' top: 'label'
  data_param { source: 'mnist-train-leveldb' batch_size: 64 }
  transform_param { scale: 0.00390625 } include: { phase: TRAIN } }
layer { name: 'mnist' type: 'Data' top: 'data' top: 'label'
  data_param { source: 'mnist-test-leveldb' batch_size: 100 }
  transform_param { scale: 0.00390625 } include: { phase: TEST } }
layer { name: 'conv1' type: 'Convolution' bottom: 'data' top: 'conv1'
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 20 kernel_size: 5 stride: 1
    weight_filler { type: 'xavier' } bias_filler { type: 'constant' } } }
layer { name: 'ip1' type: 'InnerProduct' bottom: 'conv1' top: 'ip1'
  param { lr_mult: 1 } param { lr_mult: 2 }
  inner_product_param { num_output: 10
    weight_filler { type: 'xavier' } bias_filler { type: 'constant' } } }
layer { name: 'accuracy' type: 'Accuracy' bottom: 'ip1' bottom: 'label' top: 'accuracy'
  include: { phase: TEST } }
layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip2' bottom: 'label' top: 'loss' }
"""


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_filter_lenet_train_test(phase):
    """TestFilterLeNetTrainTest: the TRAIN net keeps the train data layer and drops the
    accuracy; the TEST net keeps the test data layer and the accuracy."""
    chunks = ["layer" + c for c in LENET_LAYERS.split("layer")[1:]]
    keep = [0, 2, 3, 5] if phase == "TRAIN" else [1, 2, 3, 4, 5]
    given = P(f"state: {{ phase: {phase} }} name: 'LeNet' " + "".join(chunks))
    expected = P(f"name: 'LeNet' " + "".join(chunks[i] for i in keep)
                 + f" state: {{ phase: {phase} }}")
    out = filter_net(given, given.state)
    assert out == expected
    assert filter_net(out, out.state) == out


def test_filter_rejects_include_and_exclude_together():
    """Net::FilterNet: 'Specify either include rules or exclude rules; not both.'"""
    p = P(three(ip="include: { phase: TRAIN } exclude: { phase: TEST } "))
    with pytest.raises(ValueError, match="'innerprod'.*include.*exclude"):
        filter_net(p, p.state)


# --------------------------------------------------------------- InsertSplits
SPLIT_CASES = {
    # (input, expected output) as in SplitLayerInsertionTest
    "NoInsertion1": ("""name: 'TestNetwork'
        layer { name: 'data' type: 'Data' top: 'data' top: 'label' }
        layer { name: 'innerprod' type: 'InnerProduct' bottom: 'data' top: 'innerprod' }
        layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'innerprod' bottom: 'label' }""",
                     None),
    "NoInsertion2": ("""name: 'TestNetwork'
        layer { name: 'data' type: 'Data' top: 'data' top: 'label' }
        layer { name: 'data_split' type: 'Split' bottom: 'data'
                top: 'data_split_0' top: 'data_split_1' }
        layer { name: 'innerprod1' type: 'InnerProduct' bottom: 'data_split_0'
                top: 'innerprod1' }
        layer { name: 'innerprod2' type: 'InnerProduct' bottom: 'data_split_1'
                top: 'innerprod2' }
        layer { name: 'loss' type: 'EuclideanLoss' bottom: 'innerprod1'
                bottom: 'innerprod2' }""", None),
    "NoInsertionWithInPlace": ("""name: 'TestNetwork'
        layer { name: 'data' type: 'Data' top: 'data' top: 'label' }
        layer { name: 'innerprod' type: 'InnerProduct' bottom: 'data' top: 'innerprod' }
        layer { name: 'relu' type: 'ReLU' bottom: 'innerprod' top: 'innerprod' }
        layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'innerprod' bottom: 'label' }""",
                               None),
    "LossInsertion": ("""name: 'UnsharedWeightsNetwork' force_backward: true
        layer { name: 'data' type: 'DummyData'
          dummy_data_param { num: 5 channels: 2 height: 3 width: 4
                             data_filler { type: 'gaussian' std: 0.01 } } top: 'data' }
        layer { name: 'innerproduct1' type: 'InnerProduct'
          inner_product_param { num_output: 10 bias_term: false
                                weight_filler { type: 'gaussian' std: 10 } }
          param { name: 'unsharedweights1' } bottom: 'data' top: 'innerproduct1'
          loss_weight: 2.5 }
        layer { name: 'innerproduct2' type: 'InnerProduct'
          inner_product_param { num_output: 10 bias_term: false
                                weight_filler { type: 'gaussian' std: 10 } }
          param { name: 'unsharedweights2' } bottom: 'data' top: 'innerproduct2' }
        layer { name: 'loss' type: 'EuclideanLoss' bottom: 'innerproduct1'
                bottom: 'innerproduct2' }""",
                      """name: 'UnsharedWeightsNetwork' force_backward: true
        layer { name: 'data' type: 'DummyData'
          dummy_data_param { num: 5 channels: 2 height: 3 width: 4
                             data_filler { type: 'gaussian' std: 0.01 } } top: 'data' }
        layer { name: 'data_data_0_split' type: 'Split' bottom: 'data'
                top: 'data_data_0_split_0' top: 'data_data_0_split_1' }
        layer { name: 'innerproduct1' type: 'InnerProduct'
          inner_product_param { num_output: 10 bias_term: false
                                weight_filler { type: 'gaussian' std: 10 } }
          param { name: 'unsharedweights1' } bottom: 'data_data_0_split_0'
          top: 'innerproduct1' }
        layer { name: 'innerproduct1_innerproduct1_0_split' type: 'Split'
                bottom: 'innerproduct1' top: 'innerproduct1_innerproduct1_0_split_0'
                top: 'innerproduct1_innerproduct1_0_split_1'
                loss_weight: 2.5 loss_weight: 0 }
        layer { name: 'innerproduct2' type: 'InnerProduct'
          inner_product_param { num_output: 10 bias_term: false
                                weight_filler { type: 'gaussian' std: 10 } }
          param { name: 'unsharedweights2' } bottom: 'data_data_0_split_1'
          top: 'innerproduct2' }
        layer { name: 'loss' type: 'EuclideanLoss'
                bottom: 'innerproduct1_innerproduct1_0_split_1' bottom: 'innerproduct2' }"""),
    "Insertion": ("""name: 'TestNetwork'
        layer { name: 'data' type: 'Data' top: 'data' top: 'label' }
        layer { name: 'innerprod1' type: 'InnerProduct' bottom: 'data' top: 'innerprod1' }
        layer { name: 'innerprod2' type: 'InnerProduct' bottom: 'data' top: 'innerprod2' }
        layer { name: 'innerprod3' type: 'InnerProduct' bottom: 'data' top: 'innerprod3' }
        layer { name: 'loss1' type: 'EuclideanLoss' bottom: 'innerprod1' bottom: 'innerprod2' }
        layer { name: 'loss2' type: 'EuclideanLoss' bottom: 'innerprod2' bottom: 'innerprod3' }
        """, """name: 'TestNetwork'
        layer { name: 'data' type: 'Data' top: 'data' top: 'label' }
        layer { name: 'data_data_0_split' type: 'Split' bottom: 'data'
                top: 'data_data_0_split_0' top: 'data_data_0_split_1'
                top: 'data_data_0_split_2' }
        layer { name: 'innerprod1' type: 'InnerProduct' bottom: 'data_data_0_split_0'
                top: 'innerprod1' }
        layer { name: 'innerprod2' type: 'InnerProduct' bottom: 'data_data_0_split_1'
                top: 'innerprod2' }
        layer { name: 'innerprod2_innerprod2_0_split' type: 'Split' bottom: 'innerprod2'
                top: 'innerprod2_innerprod2_0_split_0' top: 'innerprod2_innerprod2_0_split_1' }
        layer { name: 'innerprod3' type: 'InnerProduct' bottom: 'data_data_0_split_2'
                top: 'innerprod3' }
        layer { name: 'loss1' type: 'EuclideanLoss' bottom: 'innerprod1'
                bottom: 'innerprod2_innerprod2_0_split_0' }
        layer { name: 'loss2' type: 'EuclideanLoss' bottom: 'innerprod2_innerprod2_0_split_1'
                bottom: 'innerprod3' }"""),
    "InsertionTwoTop": ("""name: 'TestNetwork'
        layer { name: 'data' type: 'Data' top: 'data' top: 'label' }
        layer { name: 'innerprod1' type: 'InnerProduct' bottom: 'data' top: 'innerprod1' }
        layer { name: 'innerprod2' type: 'InnerProduct' bottom: 'label' top: 'innerprod2' }
        layer { name: 'innerprod3' type: 'InnerProduct' bottom: 'data' top: 'innerprod3' }
        layer { name: 'innerprod4' type: 'InnerProduct' bottom: 'label' top: 'innerprod4' }
        layer { name: 'loss1' type: 'EuclideanLoss' bottom: 'innerprod1' bottom: 'innerprod3' }
        layer { name: 'loss2' type: 'EuclideanLoss' bottom: 'innerprod2' bottom: 'innerprod4' }
        """, """name: 'TestNetwork'
        layer { name: 'data' type: 'Data' top: 'data' top: 'label' }
        layer { name: 'data_data_0_split' type: 'Split' bottom: 'data'
                top: 'data_data_0_split_0' top: 'data_data_0_split_1' }
        layer { name: 'label_data_1_split' type: 'Split' bottom: 'label'
                top: 'label_data_1_split_0' top: 'label_data_1_split_1' }
        layer { name: 'innerprod1' type: 'InnerProduct' bottom: 'data_data_0_split_0'
                top: 'innerprod1' }
        layer { name: 'innerprod2' type: 'InnerProduct' bottom: 'label_data_1_split_0'
                top: 'innerprod2' }
        layer { name: 'innerprod3' type: 'InnerProduct' bottom: 'data_data_0_split_1'
                top: 'innerprod3' }
        layer { name: 'innerprod4' type: 'InnerProduct' bottom: 'label_data_1_split_1'
                top: 'innerprod4' }
        layer { name: 'loss1' type: 'EuclideanLoss' bottom: 'innerprod1' bottom: 'innerprod3' }
        layer { name: 'loss2' type: 'EuclideanLoss' bottom: 'innerprod2' bottom: 'innerprod4' }
        """),
    "WithInPlace": ("""name: 'TestNetwork'
        layer { name: 'data' type: 'Data' top: 'data' top: 'label' }
        layer { name: 'innerprod1' type: 'InnerProduct' bottom: 'data' top: 'innerprod1' }
        layer { name: 'relu1' type: 'ReLU' bottom: 'innerprod1' top: 'innerprod1' }
        layer { name: 'innerprod2' type: 'InnerProduct' bottom: 'innerprod1' top: 'innerprod2' }
        layer { name: 'loss1' type: 'EuclideanLoss' bottom: 'innerprod1' bottom: 'label' }
        layer { name: 'loss2' type: 'EuclideanLoss' bottom: 'innerprod2' bottom: 'data' }
        """, """name: 'TestNetwork'
        layer { name: 'data' type: 'Data' top: 'data' top: 'label' }
        layer { name: 'data_data_0_split' type: 'Split' bottom: 'data'
                top: 'data_data_0_split_0' top: 'data_data_0_split_1' }
        layer { name: 'innerprod1' type: 'InnerProduct' bottom: 'data_data_0_split_0'
                top: 'innerprod1' }
        layer { name: 'relu1' type: 'ReLU' bottom: 'innerprod1' top: 'innerprod1' }
        layer { name: 'innerprod1_relu1_0_split' type: 'Split' bottom: 'innerprod1'
                top: 'innerprod1_relu1_0_split_0' top: 'innerprod1_relu1_0_split_1' }
        layer { name: 'innerprod2' type: 'InnerProduct' bottom: 'innerprod1_relu1_0_split_0'
                top: 'innerprod2' }
        layer { name: 'loss1' type: 'EuclideanLoss' bottom: 'innerprod1_relu1_0_split_1'
                bottom: 'label' }
        layer { name: 'loss2' type: 'EuclideanLoss' bottom: 'innerprod2'
                bottom: 'data_data_0_split_1' }"""),
}


@pytest.mark.parametrize("case", sorted(SPLIT_CASES))
def test_insert_splits(case):
    """SplitLayerInsertionTest: InsertSplits gives Caffe's expected net (split layer and
    blob names, loss weight moved onto the split), and is idempotent."""
    given, expected = SPLIT_CASES[case]
    given = P(given)
    expected = given if expected is None else P(expected)
    out = insert_splits(given)
    assert out == expected, case
    assert insert_splits(out) == out


def test_input_insertion():
    """TestInputInsertion: a split of a legacy input blob is named after the input, as
    'data_input_0_split' (minicaffe upgrades the input fields to a layer named 'input'
    first, as UpgradeNetInput does, which gives the same names)."""
    given = upgrade_net(P("""name: 'TestNetwork' input: 'data'
        input_dim: 10 input_dim: 3 input_dim: 227 input_dim: 227
        layer { name: 'innerprod1' type: 'InnerProduct' bottom: 'data' top: 'innerprod1' }
        layer { name: 'innerprod2' type: 'InnerProduct' bottom: 'data' top: 'innerprod2' }
        layer { name: 'loss' type: 'EuclideanLoss' bottom: 'innerprod1'
                bottom: 'innerprod2' }"""))
    out = insert_splits(given)
    assert [(l.name, l.type) for l in out.layer] == [
        ("input", "Input"), ("data_input_0_split", "Split"), ("innerprod1", "InnerProduct"),
        ("innerprod2", "InnerProduct"), ("loss", "EuclideanLoss")]
    assert list(out.layer[1].top) == ["data_input_0_split_0", "data_input_0_split_1"]
    assert [list(l.bottom) for l in out.layer[2:4]] == [["data_input_0_split_0"],
                                                        ["data_input_0_split_1"]]
